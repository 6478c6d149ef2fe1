#include "fsdpp/data/bpe_tokenizer.hpp"

#include "fsdpp/data/regex_splitter.hpp"
#include "fsdpp/data/utf8.hpp"
#include "fsdpp/runtime/error.hpp"

#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>
#include <vector>

namespace fsdpp {
namespace {

using Json = nlohmann::json;

// HF tokenizers' ByteLevel expression (GPT-2's, with \p classes).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::size_t kMaxCachedPieces = 1 << 20;  // bounds the cache (~100 MB at worst); later pieces go uncached
constexpr std::size_t kNormalizedLookahead = 64;    // bytes of following text normalized for the regexes to see

struct AddedToken {
  std::string content;
  std::uint32_t id = 0;
  bool lstrip = false, rstrip = false;
};

// Everything read from the file; shared read-only by the forks of a tokenizer.
struct BpeModel {
  std::string origin;
  std::unordered_map<std::string, std::uint32_t> vocab;
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>> merges;  // (left, right) -> (rank, id)
  std::array<std::int64_t, 256> byte_ids{};  // the id of each byte's code point; -1: not in the vocabulary
  std::optional<std::uint32_t> unk_id;
  bool ignore_merges = false;
  bool add_prefix_space = false;
  bool nfc = false;  // the NFC normalizer (Qwen): each segment between added tokens is NFC-normalized first
  std::vector<std::shared_ptr<const RegexSplitter>> splits;  // Split steps, then ByteLevel's own if use_regex
  std::vector<AddedToken> added;                             // longest first
  std::array<bool, 256> added_first_byte{};
  std::int64_t vocab_size = 0;
  std::optional<std::uint32_t> eot_id, bos_id;  // a corpus's document separator and prefix (read_special_ids)
  std::string pre_tokenizer_text;
  std::vector<std::string> id_bytes;  // decode: each id's bytes (a vocabulary token's, mapped back; an added token's)
};

std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) { return (std::uint64_t{a} << 32) | b; }

[[noreturn]] void refuse(const BpeModel& m, const std::string& what) {
  throw UsageError(fmt::format("{}: {}; fsdpp reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen "
                               "style) and SentencePiece .model files",
                               m.origin, what));
}

const Json& member(const BpeModel& m, const Json& j, const char* key, const char* where) {
  if (!j.is_object() || !j.contains(key)) refuse(m, fmt::format("{} has no '{}'", where, key));
  return j.at(key);
}

bool flag(const Json& j, const char* key) { return j.contains(key) && j.at(key).is_boolean() && j.at(key).get<bool>(); }

// null, NFC, or a Sequence of those (DeepSeek V3's file has an empty one): what the text is NFC-normalized by.
void read_normalizer(BpeModel& m, const Json& normalizer) {
  if (normalizer.is_null()) return;
  const std::string type = normalizer.value("type", std::string("?"));
  if (type == "Sequence" && normalizer.contains("normalizers") && normalizer.at("normalizers").is_array()) {
    for (const Json& step : normalizer.at("normalizers")) read_normalizer(m, step);
    return;
  }
  if (type != "NFC")
    refuse(m, fmt::format("unsupported normalizer '{}' (implemented: null, NFC, a Sequence of them)", type));
  m.nfc = true;
}

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// Appends NFC(text) to `out` (ICU; ASCII, the common case, is its own NFC and is copied).
void append_nfc(std::string& out, std::string_view text) {
  if (is_ascii(text)) return void(out.append(text));
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(error);
  icu::StringByteSink<std::string> sink(&out);
  if (U_SUCCESS(error))
    nfc->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<std::int32_t>(text.size())), sink, nullptr, error);
  if (U_FAILURE(error)) throw Error(fmt::format("ICU NFC normalization failed: {}", u_errorName(error)));
}

void add_split(BpeModel& m, const Json& step) {
  const std::string behavior = step.value("behavior", std::string("?"));
  if (behavior != "Isolated")
    refuse(m, fmt::format("unsupported Split behavior '{}' in pre_tokenizer (only 'Isolated' is implemented)",
                          behavior));
  if (flag(step, "invert")) refuse(m, "unsupported Split with invert=true in pre_tokenizer");
  const Json& pattern = member(m, step, "pattern", "the Split pre_tokenizer");
  if (pattern.contains("Regex"))
    m.splits.push_back(std::make_shared<RegexSplitter>(pattern.at("Regex").get<std::string>(), false, m.origin));
  else if (pattern.contains("String"))
    m.splits.push_back(std::make_shared<RegexSplitter>(pattern.at("String").get<std::string>(), true, m.origin));
  else
    refuse(m, "the Split pre_tokenizer's pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
}

void add_byte_level(BpeModel& m, const Json& step) {
  m.add_prefix_space = flag(step, "add_prefix_space");
  // use_regex defaults to true in HF tokenizers (older files omit it).
  if (!step.contains("use_regex") || flag(step, "use_regex"))
    m.splits.push_back(std::make_shared<RegexSplitter>(kGpt2Pattern, false, m.origin));
}

void read_pre_tokenizer(BpeModel& m, const Json& root) {
  const Json& pre = member(m, root, "pre_tokenizer", "the file");
  if (pre.is_null()) refuse(m, "pre_tokenizer is null, so this is not a byte-level BPE tokenizer");
  m.pre_tokenizer_text = pre.value("type", std::string("?"));
  if (m.pre_tokenizer_text == "ByteLevel") return add_byte_level(m, pre);
  if (m.pre_tokenizer_text != "Sequence")
    refuse(m, fmt::format("unsupported pre_tokenizer '{}' (implemented: ByteLevel, or a Sequence of Split steps "
                          "ending in ByteLevel)",
                          m.pre_tokenizer_text));
  const Json& steps = member(m, pre, "pretokenizers", "the Sequence pre_tokenizer");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string type = steps[i].value("type", std::string("?"));
    const bool last = i + 1 == steps.size();
    if (type == "Split" && !last) {
      add_split(m, steps[i]);
    } else if (type == "ByteLevel" && last) {
      add_byte_level(m, steps[i]);
    } else {
      refuse(m, fmt::format("unsupported pre_tokenizer step {} '{}' in the Sequence (implemented: Split steps, "
                            "then ByteLevel last)",
                            i, type));
    }
  }
  if (steps.empty()) refuse(m, "the Sequence pre_tokenizer is empty (expected Split steps, then ByteLevel)");
  m.pre_tokenizer_text = fmt::format("Sequence of {} Split + ByteLevel", steps.size() - 1);
}

std::uint32_t vocab_id(const BpeModel& m, const std::string& token, std::size_t merge_index) {
  const auto it = m.vocab.find(token);
  if (it == m.vocab.end())
    refuse(m, fmt::format("merge {} uses '{}', which is not in the vocabulary (a corrupt file?)", merge_index, token));
  return it->second;
}

void read_merges(BpeModel& m, const Json& merges) {
  for (std::size_t i = 0; i < merges.size(); ++i) {
    std::string left, right;
    const Json& merge = merges[i];
    if (merge.is_string()) {  // "a b"
      const std::string text = merge.get<std::string>();
      const auto space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        refuse(m, fmt::format("merge {} '{}' is not two tokens separated by one space", i, text));
      left = text.substr(0, space), right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {  // [a, b]
      left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    } else {
      refuse(m, fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", i));
    }
    const std::uint32_t a = vocab_id(m, left, i), b = vocab_id(m, right, i), ab = vocab_id(m, left + right, i);
    m.merges.emplace(pair_key(a, b), std::make_pair(static_cast<std::uint32_t>(i), ab));  // the first rank wins
  }
}

void read_model(BpeModel& m, const Json& root) {
  const Json& model = member(m, root, "model", "the file");
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") refuse(m, fmt::format("unsupported model type '{}' (only BPE is implemented)", type));
  if (model.contains("dropout") && !model.at("dropout").is_null())
    refuse(m, "unsupported BPE dropout (tokenizing a corpus needs deterministic ids)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty())
      refuse(m, fmt::format("unsupported BPE {} (byte-level BPE uses none)", key));
  if (flag(model, "byte_fallback")) refuse(m, "unsupported BPE byte_fallback (byte-level BPE needs none)");
  m.ignore_merges = flag(model, "ignore_merges");
  for (const auto& [token, id] : member(m, model, "vocab", "the model").items()) {
    m.vocab.emplace(token, id.get<std::uint32_t>());
    m.vocab_size = std::max<std::int64_t>(m.vocab_size, std::int64_t{id.get<std::uint32_t>()} + 1);
  }
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const auto it = m.vocab.find(model.at("unk_token").get<std::string>());
    if (it != m.vocab.end()) m.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    std::string key;
    append_utf8(key, byte_to_unicode()[b]);
    const auto it = m.vocab.find(key);
    m.byte_ids[b] = it == m.vocab.end() ? -1 : std::int64_t{it->second};
  }
  read_merges(m, member(m, model, "merges", "the model"));
}

// Ids as HF assigns them when it loads the file: a token in the model's vocabulary keeps that id; any other
// takes the next id after the vocabulary (or after the last such token), whatever id the file states.
void read_added_tokens(BpeModel& m, const Json& root) {
  if (!root.contains("added_tokens")) return;
  std::optional<std::uint32_t> last_new;
  for (const Json& t : root.at("added_tokens")) {
    AddedToken token{t.at("content").get<std::string>(), t.at("id").get<std::uint32_t>(), flag(t, "lstrip"),
                     flag(t, "rstrip")};
    if (flag(t, "single_word"))
      refuse(m, fmt::format("unsupported single_word=true on added token '{}'", token.content));
    if (token.content.empty()) continue;
    const auto known = m.vocab.find(token.content);
    if (known != m.vocab.end()) {
      token.id = known->second;
    } else {
      const auto entries = static_cast<std::uint32_t>(m.vocab.size());
      token.id = last_new && *last_new >= entries ? *last_new + 1 : entries;
      last_new = token.id;
    }
    m.vocab_size = std::max<std::int64_t>(m.vocab_size, std::int64_t{token.id} + 1);
    m.added_first_byte[static_cast<unsigned char>(token.content[0])] = true;
    m.added.push_back(std::move(token));
  }
  std::stable_sort(m.added.begin(), m.added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
}

// The id of `content` as an added token or a vocabulary entry, if it is either.
std::optional<std::uint32_t> token_id(const BpeModel& m, const std::string& content) {
  for (const AddedToken& t : m.added)
    if (t.content == content) return t.id;
  const auto it = m.vocab.find(content);
  if (it != m.vocab.end()) return it->second;
  return std::nullopt;
}

// The BOS of a TemplateProcessing post-processor (alone or in a Sequence): the special token its "single" template
// starts with, as `tokenizers` adds it with add_special_tokens=True.
std::optional<std::uint32_t> template_bos(const BpeModel& m, const Json& processor) {
  if (!processor.is_object()) return std::nullopt;
  const std::string type = processor.value("type", "");
  if (type == "Sequence" && processor.contains("processors")) {
    for (const Json& p : processor.at("processors"))
      if (auto id = template_bos(m, p)) return id;
    return std::nullopt;
  }
  if (type != "TemplateProcessing" || !processor.contains("single") || processor.at("single").empty())
    return std::nullopt;
  const Json& first = processor.at("single").at(0);
  if (!first.contains("SpecialToken")) return std::nullopt;
  const std::string name = first.at("SpecialToken").at("id").get<std::string>();
  const Json& specials = processor.value("special_tokens", Json::object());
  if (specials.contains(name) && !specials.at(name).value("ids", Json::array()).empty())
    return specials.at(name).at("ids").at(0).get<std::uint32_t>();
  if (auto id = token_id(m, name)) return id;
  refuse(m, fmt::format("the post_processor's template starts with '{}', which is no token", name));
}

// End of text: the first of these that the file has (GPT-2 and Qwen, Llama 3, SentencePiece conversions).
void read_special_ids(BpeModel& m, const Json& root) {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if ((m.eot_id = token_id(m, name))) break;
  if (root.contains("post_processor")) m.bos_id = template_bos(m, root.at("post_processor"));
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(std::shared_ptr<const BpeModel> model) : m_(std::move(model)) {
    for (const auto& split : m_->splits) scratch_.push_back(split->scratch());
  }

  std::int64_t vocab_size() const override { return m_->vocab_size; }
  std::string describe() const override {
    return fmt::format("byte-level BPE from {} ({} ids: {} in the vocabulary, {} merges, {} added tokens; "
                       "pre-tokenizer {}{})",
                       m_->origin, m_->vocab_size, m_->vocab.size(), m_->merges.size(), m_->added.size(),
                       m_->pre_tokenizer_text, engines());
  }
  std::unique_ptr<Tokenizer> fork() const override { return std::make_unique<BpeTokenizer>(m_); }
  std::optional<std::uint32_t> end_of_text_id() const override { return m_->eot_id; }
  std::optional<std::uint32_t> bos_id() const override { return m_->bos_id; }

  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::string text;
    for (std::uint32_t id : ids) {
      if (id >= m_->id_bytes.size())
        throw UsageError(fmt::format("{}: token id {} is outside its {} ids", m_->origin, id, m_->vocab_size));
      text += m_->id_bytes[id];
    }
    return text;
  }

  void encode(std::string_view window, std::size_t length, bool starts_text, std::vector<std::uint32_t>& out) override {
    std::size_t pos = 0;
    bool segment_starts = starts_text;
    while (pos < length) {
      const Match added = next_added(window, pos, length);
      encode_text(window, pos, added.begin, added.found ? added.begin : window.size(), segment_starts, out);
      if (!added.found) break;
      out.push_back(added.id);
      pos = added.end;
      segment_starts = true;
    }
  }

 private:
  // Which engine matches each expression: PCRE2 (translated) where it can, Oniguruma where not (and why).
  std::string engines() const {
    std::string text;
    for (std::size_t s = 0; s < m_->splits.size(); ++s)
      if (m_->splits[s]->engine() == RegexSplitter::Engine::oniguruma)
        text += fmt::format("; expression {} on Oniguruma: {}", s + 1, m_->splits[s]->untranslated());
    return m_->splits.empty() || !text.empty() ? text : "; expressions on PCRE2 with Oniguruma's meaning";
  }

  struct Match {
    bool found = false;
    std::size_t begin = 0, end = 0;
    std::uint32_t id = 0;
  };

  // Leftmost-longest added token in window[from, length), widened over whitespace by lstrip/rstrip.
  Match next_added(std::string_view window, std::size_t from, std::size_t length) const {
    Match match;
    match.begin = length;
    if (m_->added.empty()) return match;
    for (std::size_t p = from; p < length; ++p) {
      if (!m_->added_first_byte[static_cast<unsigned char>(window[p])]) continue;
      for (const AddedToken& t : m_->added) {  // longest first
        if (window.compare(p, t.content.size(), t.content) != 0 || p + t.content.size() > length) continue;
        match = {true, p, p + t.content.size(), t.id};
        if (t.lstrip)
          while (match.begin > from && is_space(static_cast<unsigned char>(window[match.begin - 1]))) --match.begin;
        if (t.rstrip)
          while (match.end < length && is_space(static_cast<unsigned char>(window[match.end]))) ++match.end;
        return match;
      }
    }
    return match;
  }

  // window[begin, end) between added tokens, with window[end, context_end) the text that follows it. Python's
  // `tokenizers` takes only valid UTF-8: each valid run is encoded as the text it would be there, and each run of
  // bytes that starts no character (invalid UTF-8) is one piece of its own, BPE-encoded from its bytes.
  void encode_text(std::string_view window, std::size_t begin, std::size_t end, std::size_t context_end,
                   bool starts, std::vector<std::uint32_t>& out) {
    while (begin < end) {
      const std::size_t valid = valid_utf8_length(window.substr(begin, end - begin));
      if (valid > 0) {
        const std::size_t run_end = begin + valid;
        // Only a run that reaches `end` sees past it: the following text, up to its first invalid byte.
        const std::size_t run_context =
            run_end < end ? run_end : end + valid_utf8_length(window.substr(end, context_end - end));
        encode_segment(window.substr(begin, run_context - begin), valid, starts, out);
        begin = run_end;
      }
      if (begin < end) {
        const std::size_t invalid = invalid_utf8_length(window.substr(begin, end - begin));
        encode_piece(window.substr(begin, invalid), out);
        begin += invalid;
        starts = true;
      }
    }
  }

  // Pre-tokenizes text[0, end) (valid UTF-8; the first Split step may look on to text's end) and BPE-encodes each
  // piece. Each step sees a text that starts where the segment or piece starts, as in `tokenizers`.
  void encode_segment(std::string_view text, std::size_t end, bool segment_starts, std::vector<std::uint32_t>& out) {
    const bool prefix = m_->add_prefix_space && segment_starts && text[0] != ' ';
    if (prefix || m_->nfc) {  // the pre-tokenizer then runs on a rewritten copy of the segment and its lookahead
      std::size_t lookahead_end = std::min(text.size(), end + kNormalizedLookahead);
      while (lookahead_end < text.size() && (static_cast<unsigned char>(text[lookahead_end]) & 0xC0) == 0x80)
        ++lookahead_end;  // a whole character
      rewritten_.assign(prefix ? " " : "");
      const std::string_view segment = text.substr(0, end), lookahead = text.substr(end, lookahead_end - end);
      if (m_->nfc) {
        append_nfc(rewritten_, segment);
        end = rewritten_.size();
        append_nfc(rewritten_, lookahead);
      } else {
        rewritten_.append(segment);
        end = rewritten_.size();
        rewritten_.append(lookahead);
      }
      text = rewritten_;
    }
    pieces_.assign(1, {0, end});
    for (std::size_t s = 0; s < m_->splits.size(); ++s) {
      next_pieces_.clear();
      for (const auto& [b, e] : pieces_) {
        // Only the first step sees past its piece: later steps split each piece as a text of its own.
        const std::size_t first = next_pieces_.size();
        m_->splits[s]->split(text.substr(b, (s == 0 ? text.size() : e) - b), 0, e - b, *scratch_[s], next_pieces_);
        for (std::size_t i = first; i < next_pieces_.size(); ++i)
          next_pieces_[i] = {next_pieces_[i].first + b, next_pieces_[i].second + b};
      }
      pieces_.swap(next_pieces_);
    }
    for (const auto& [b, e] : pieces_) encode_piece(text.substr(b, e - b), out);
  }

  void encode_piece(std::string_view bytes, std::vector<std::uint32_t>& out) {
    key_.assign(bytes.data(), bytes.size());
    const auto hit = cache_.find(key_);
    if (hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    std::vector<std::uint32_t> ids;
    bpe(bytes, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cache_.size() < kMaxCachedPieces) cache_.emplace(key_, std::move(ids));
  }

  struct Symbol {
    std::uint32_t id;
    int prev, next;
    bool alive;
  };
  struct Candidate {
    std::uint32_t rank;
    int pos;
    std::uint32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  // BPE as HF's Word::merge_all: repeatedly merge the adjacent pair of lowest rank (leftmost among equal ranks).
  void bpe(std::string_view bytes, std::vector<std::uint32_t>& ids) {
    if (m_->ignore_merges) {
      const auto whole = m_->vocab.find(byte_level_string(bytes));
      if (whole != m_->vocab.end()) return ids.push_back(whole->second);
    }
    symbols_.clear();
    for (unsigned char b : bytes) {
      const std::int64_t id = m_->byte_ids[b];
      if (id < 0 && !m_->unk_id) continue;  // HF drops a character it cannot represent when there is no unk
      const int at = static_cast<int>(symbols_.size());
      symbols_.push_back({id < 0 ? *m_->unk_id : static_cast<std::uint32_t>(id), at - 1, at + 1, true});
    }
    if (symbols_.empty()) return;
    symbols_.back().next = -1;
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    auto consider = [&](int pos) {
      if (pos < 0 || symbols_[pos].next < 0) return;
      const auto it = m_->merges.find(pair_key(symbols_[pos].id, symbols_[symbols_[pos].next].id));
      if (it != m_->merges.end()) queue.push({it->second.first, pos, it->second.second});
    };
    for (int i = 0; i + 1 < static_cast<int>(symbols_.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = symbols_[c.pos];
      if (!left.alive || left.next < 0) continue;
      const auto it = m_->merges.find(pair_key(left.id, symbols_[left.next].id));
      if (it == m_->merges.end() || it->second.second != c.merged) continue;  // stale: a neighbour changed
      Symbol& right = symbols_[left.next];
      right.alive = false;
      left.id = c.merged;
      left.next = right.next;
      if (left.next >= 0) symbols_[left.next].prev = c.pos;
      consider(left.prev);
      consider(c.pos);
    }
    for (int i = 0; i >= 0; i = symbols_[i].next) ids.push_back(symbols_[i].id);
  }

  std::shared_ptr<const BpeModel> m_;
  std::vector<RegexSplitter::ScratchPtr> scratch_;
  std::vector<std::pair<std::size_t, std::size_t>> pieces_, next_pieces_;
  std::vector<Symbol> symbols_;
  std::unordered_map<std::string, std::vector<std::uint32_t>> cache_;
  std::string key_, rewritten_;
};

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable(b) ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

std::string byte_level_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_to_unicode()[b]);
  return out;
}

namespace {

// The bytes of every id: ByteLevel's decoder maps a vocabulary token's code points back to bytes (the inverse of
// byte_to_unicode; a code point outside it stays as its UTF-8, as tokenizers' decoder leaves it); an added token
// is its content as it is.
void read_decoding_table(BpeModel& m) {
  std::unordered_map<char32_t, unsigned char> to_byte;
  for (int b = 0; b < 256; ++b) to_byte[byte_to_unicode()[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);
  m.id_bytes.assign(static_cast<std::size_t>(m.vocab_size), std::string());
  for (const auto& [token, id] : m.vocab) {
    std::string& bytes = m.id_bytes[id];
    for (std::size_t i = 0; i < token.size();) {
      const unsigned char lead = static_cast<unsigned char>(token[i]);
      const std::size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      char32_t cp = length == 1 ? lead : lead & (0x3F >> (length - 1));
      for (std::size_t k = 1; k < length && i + k < token.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
      const auto found = to_byte.find(cp);
      if (found != to_byte.end())
        bytes.push_back(static_cast<char>(found->second));
      else
        bytes.append(token, i, length);
      i += length;
    }
  }
  for (const AddedToken& t : m.added) m.id_bytes[t.id] = t.content;
}

}  // namespace

std::unique_ptr<Tokenizer> bpe_tokenizer_from_json(std::string_view json_text, const std::string& origin) {
  auto model = std::make_shared<BpeModel>();
  model->origin = origin;
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::parse_error& e) {
    throw UsageError(fmt::format("{}: not valid JSON (byte {}): {}; a tokenizer.json from Hugging Face, or a "
                                 "SentencePiece .model, is expected",
                                 origin, e.byte, e.what()));
  }
  try {
    if (root.contains("normalizer")) read_normalizer(*model, root.at("normalizer"));
    read_pre_tokenizer(*model, root);
    read_model(*model, root);
    read_added_tokens(*model, root);
    read_special_ids(*model, root);
    read_decoding_table(*model);
  } catch (const Json::exception& e) {  // a field of the wrong type
    throw UsageError(fmt::format("{}: unexpected tokenizer.json structure: {}", origin, e.what()));
  }
  return std::make_unique<BpeTokenizer>(std::move(model));
}

}  // namespace fsdpp
