#include "fsdpp/data/sentencepiece_tokenizer.hpp"

#include "fsdpp/runtime/error.hpp"

#include <sentencepiece_processor.h>

namespace fsdpp {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp, std::string origin)
      : sp_(std::move(sp)), origin_(std::move(origin)) {}

  std::int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  std::string describe() const override {
    return fmt::format("SentencePiece from {} ({} ids, encoded a line at a time)", origin_, sp_->GetPieceSize());
  }
  std::unique_ptr<Tokenizer> fork() const override { return std::make_unique<SentencePieceTokenizer>(sp_, origin_); }
  std::optional<std::uint32_t> end_of_text_id() const override { return id_or_none(sp_->eos_id()); }
  std::optional<std::uint32_t> bos_id() const override { return id_or_none(sp_->bos_id()); }

  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::vector<int> pieces;
    for (std::uint32_t id : ids) {
      if (static_cast<std::int64_t>(id) >= sp_->GetPieceSize())
        throw UsageError(fmt::format("{}: token id {} is outside its {} pieces", origin_, id, sp_->GetPieceSize()));
      pieces.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = sp_->Decode(pieces, &text);
    if (!status.ok()) throw Error(fmt::format("{}: SentencePiece failed to decode: {}", origin_, status.ToString()));
    return text;
  }

  void encode(std::string_view window, std::size_t length, bool, std::vector<std::uint32_t>& out) override {
    const std::string_view text = window.substr(0, length);
    for (std::size_t begin = 0; begin < text.size();) {
      const std::size_t newline = text.find('\n', begin);
      const std::size_t end = newline == std::string_view::npos ? text.size() : newline + 1;
      const auto status = sp_->Encode(text.substr(begin, end - begin), &ids_);
      if (!status.ok())
        throw Error(fmt::format("{}: SentencePiece failed to encode a line: {}", origin_, status.ToString()));
      for (int id : ids_) out.push_back(static_cast<std::uint32_t>(id));
      begin = end;
    }
  }

 private:
  static std::optional<std::uint32_t> id_or_none(int id) {
    return id >= 0 ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(id)) : std::nullopt;
  }
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
  std::string origin_;
  std::vector<int> ids_;
};

}  // namespace

std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_path) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(model_path);
  if (!status.ok())
    throw UsageError(fmt::format("{}: neither a Hugging Face tokenizer.json (it does not start with '{{') nor a "
                                 "SentencePiece .model that libsentencepiece can load: {}",
                                 model_path, status.ToString()));
  return std::make_unique<SentencePieceTokenizer>(std::move(sp), model_path);
}

}  // namespace fsdpp
