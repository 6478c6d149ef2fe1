// fsdpp report <run-folder>: report.png (loss and validation loss, tokens/s, grad norm against step; for a mixture
// of experts also the expert load, the busiest expert's tokens over the mean, per sparse layer) and a short text
// summary, from <run>/metrics.jsonl. The plot is drawn by gnuplot (Debian's gnuplot-nox), run as an
// external program on a data file and a script written next to the report.
// --trace: the timeline of run.trace instead (observe/trace_analysis.hpp): <run>/trace/merged.json, a table of
// communication per unit, operation and mesh dimension, and trace.png (one row per rank and track); --json
// prints the table as one JSON object. Under a pipeline it also draws the schedule as it ran, from each rank's
// action spans (parallel/pipeline_schedule.hpp's picture: digits forwards, letters backwards, dots idle).
#include "commands.hpp"

#include "fsdpp/observe/trace_analysis.hpp"
#include "fsdpp/parallel/pipeline_schedule.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

namespace fsdpp::app {
namespace {

struct MetricsRow {
  double step, loss, tokens_per_s, grad_norm;
  std::optional<double> val;
  std::vector<double> expert_load;  // per sparse layer (expert_load_per_layer); empty for a dense model
};

// Columns of the data file: step, loss, tokens/s, grad norm, validation loss (-1: none), then the expert load of
// each of `sparse_layers` layers.
std::string plot_script(const std::string& data, const std::string& png, const std::string& title, int sparse_layers) {
  std::string load;
  for (int l = 0; l < sparse_layers; ++l)
    load += fmt::format("{}'{}' using 1:{} with lines title 'sparse layer {}'", l ? ", " : "", data, 6 + l, l);
  return fmt::format(
      "set terminal pngcairo size 1200,{} font ',10'\n"
      "set output '{}'\n"
      "set multiplot layout {},1 title '{}'\n"
      "set xlabel 'step'\nset grid\n"
      "set ylabel 'loss'\n"
      "plot '{}' using 1:2 with lines title 'train loss', '' using 1:($5 == -1 ? NaN : $5) with linespoints "
      "title 'validation loss'\n"
      "set ylabel 'tokens/s'\nplot '{}' using 1:3 with lines title 'tokens/s'\n"
      "set ylabel 'grad norm'\nplot '{}' using 1:4 with lines title 'grad norm'\n"
      "{}"
      "unset multiplot\n",
      sparse_layers ? 1200 : 900, png, sparse_layers ? 4 : 3, title, data, data, data,
      sparse_layers ? fmt::format("set ylabel 'expert load (max / mean)'\nplot {}\n", load) : "");
}

// Text inside a gnuplot single-quoted string, where a quote is written twice.
std::string gnuplot_quoted(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out;
}

void run_gnuplot(const std::filesystem::path& folder, const std::filesystem::path& script, const std::string& log) {
  const int rc = std::system(fmt::format("gnuplot '{}' 2> '{}'", script.string(), (folder / log).string()).c_str());
  FSDPP_REQUIRE(rc == 0, "gnuplot failed (exit {}); see {}. Install it with apt-get install gnuplot-nox", rc,
                (folder / log).string());
}

// trace.png: a box per span, one row per rank x track (top to bottom), a colour per category; spans nested on
// the compute track are drawn thinner on top of the ones holding them.
void plot_trace(const TraceReport& t, const std::filesystem::path& folder) {
  const std::filesystem::path data = folder / "trace.dat", script = folder / "trace.gp", png = folder / "trace.png";
  const char* colours[] = {"#b0b0b0", "#4e79a7", "#f28e2b", "#edc948", "#59a14f", "#e15759", "#76b7b2", "#9c755f",
                           "#b07aa1", "#ff0000"};
  std::string plots;
  {
    std::ofstream out(data);
    int block = 0;  // gnuplot's `index`: the data blocks, two blank lines apart, of the categories that occur
    for (std::size_t c = 0; c < t.categories.size(); ++c) {
      std::string rows;
      for (const TraceBox& b : t.boxes) {
        if (b.category != static_cast<int>(c)) continue;
        const double half = std::max(0.12, 0.42 - 0.07 * b.depth);
        rows += fmt::format("{} {} {} {} {}\n", b.start_ms, b.end_ms, b.row, b.row - half, b.row + half);
      }
      if (rows.empty()) continue;
      out << "# " << t.categories[c] << "\n" << rows << "\n\n";
      plots += fmt::format("{}'{}' index {} using 1:3:1:2:4:5 with boxxyerror fc rgb '{}' title '{}'",
                           plots.empty() ? "" : ", ", data.string(), block++, colours[c % 10], t.categories[c]);
    }
  }
  std::string ytics;
  for (std::size_t r = 0; r < t.rows.size(); ++r) ytics += fmt::format("{}'{}' {}", r ? ", " : "", gnuplot_quoted(t.rows[r]), r);
  std::ofstream(script) << fmt::format(
      "set terminal pngcairo noenhanced size 1400,{} font ',10'\n"
      "set output '{}'\n"
      "set title '{}: steps {}-{} on {} ranks'\n"
      "set xlabel 'ms since the first traced step began'\nset grid xtics\n"
      "set yrange [{}:-0.6]\nset ytics ({})\n"
      "set style fill solid 1.0 noborder\nset key outside right top\n"
      "plot {}\n",
      std::max(300, 140 + 60 * static_cast<int>(t.rows.size())), png.string(), gnuplot_quoted(folder.parent_path().filename().string()),
      t.first_step, t.last_step, t.ranks, t.rows.size() - 0.4, ytics, plots);
  run_gnuplot(folder, script, "trace.log");
}

// The pipeline's actions as they ran, drawn like the schedule's replay: an action from when its inputs had arrived
// (its span's start plus its receive wait) to its end, one character per half a median forward, time 0 at the
// first.
struct RanPipeline {
  double unit_ms = 0;
  std::string picture;
  std::vector<std::vector<std::string>> order;  // per rank, the actions in the order they ran
};

std::optional<RanPipeline> ran_pipeline(const TraceReport& t) {
  if (t.pipeline.empty()) return std::nullopt;
  PipelineTimeline timeline;
  timeline.ranks.resize(t.pipeline.size());
  RanPipeline out;
  out.order.resize(t.pipeline.size());
  double zero = 1e300;
  std::vector<double> forwards;
  for (const auto& ran : t.pipeline)
    for (const TracedAction& a : ran) zero = std::min(zero, a.start_ms + a.waited_ms);
  for (std::size_t r = 0; r < t.pipeline.size(); ++r)
    for (const TracedAction& a : t.pipeline[r]) {
      const std::optional<PipelineAction> action = parse_pipeline_action(a.action);
      if (!action) continue;
      const double start = a.start_ms + a.waited_ms - zero, end = a.end_ms - zero;
      timeline.ranks[r].push_back({*action, start, end});
      timeline.makespan = std::max(timeline.makespan, end);
      if (action->op == PipelineOp::forward) forwards.push_back(end - start);
      out.order[r].push_back(a.action);
    }
  if (forwards.empty()) return std::nullopt;
  std::nth_element(forwards.begin(), forwards.begin() + forwards.size() / 2, forwards.end());
  // Half a forward per character (so that every action has a cell of its own), unless that is wider than 200
  // characters (several traced steps).
  out.unit_ms = std::max({forwards[forwards.size() / 2] / 2, timeline.makespan / 200, 1e-6});
  out.picture = draw_pipeline(timeline, out.unit_ms);
  return out;
}

int report_trace(const std::string& run, bool json) {
  const TraceReport t = analyze_trace(run);
  const std::filesystem::path folder = std::filesystem::path(run) / "trace";
  plot_trace(t, folder);
  const std::optional<RanPipeline> pipeline = ran_pipeline(t);
  if (json) {
    nlohmann::json out = nlohmann::json::parse(t.json);
    if (pipeline)
      out["pipeline"] = {{"unit_ms", pipeline->unit_ms}, {"picture", pipeline->picture}, {"order", pipeline->order}};
    fmt::print("{}\n", out.dump());
    return 0;
  }
  std::string text = t.table;
  if (pipeline)
    text += fmt::format("pipeline schedule as it ran (world ranks; one character = {:.2f} ms, half a forward's median or 1/200 of the whole; digits: "
                        "forwards of micro-batch i mod 10, letters: their backwards (zero_bubble: their input gradients, and "
                        "capitals their weight gradients), dots: idle or another phase)\n{}",
                        pipeline->unit_ms, pipeline->picture);
  Log::info("{}wrote {} and {}", text, t.merged_path, (folder / "trace.png").string());
  return 0;
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto* cli = app.add_subcommand("report", "Plot a run's metrics.jsonl into report.png, with a text summary");
  auto run = std::make_shared<std::string>();
  cli->add_option("run", *run, "The run folder (run.output) holding metrics.jsonl")->required();
  auto trace = std::make_shared<bool>(false), json = std::make_shared<bool>(false);
  cli->add_flag("--trace", *trace,
                "Summarize the timeline of run.trace instead: merge <run>/trace/rank*.json into merged.json (open it "
                "in ui.perfetto.dev), print communication per unit, operation and mesh dimension, draw trace.png");
  cli->add_flag("--json", *json, "With --trace: print the summary as one JSON object");
  return {cli, [run, trace, json](Runtime& rt) {
            if (rt.rank() != 0) return 0;  // one writer; the others have nothing to do
            FSDPP_REQUIRE(*trace || !*json, "--json goes with --trace: fsdpp report {} --trace --json", *run);
            if (*trace) return report_trace(*run, *json);
            namespace fs = std::filesystem;
            const fs::path folder(*run), metrics = folder / "metrics.jsonl";
            std::ifstream in(metrics);
            FSDPP_REQUIRE(in.good(), "cannot read {}: is '{}' a run folder (run.output)?", metrics.string(), *run);
            std::vector<MetricsRow> rows;
            std::string line;
            for (int number = 1; std::getline(in, line); ++number) {
              if (line.empty()) continue;
              nlohmann::json j;
              try {
                j = nlohmann::json::parse(line);
                MetricsRow r{j.at("step").get<double>(), j.at("loss").get<double>(), j.at("tokens_per_s").get<double>(),
                      j.at("grad_norm").get<double>(), std::nullopt, {}};
                if (j.contains("val_loss")) r.val = j["val_loss"].get<double>();
                if (j.contains("expert_load_per_layer")) r.expert_load = j["expert_load_per_layer"].get<std::vector<double>>();
                rows.push_back(r);
              } catch (const std::exception& e) {
                throw UsageError(fmt::format("{}:{}: not a metrics record: {}", metrics.string(), number, e.what()));
              }
            }
            FSDPP_REQUIRE(!rows.empty(), "{} holds no steps yet", metrics.string());
            const fs::path data = folder / "report.dat", script = folder / "report.gp", png = folder / "report.png";
            const int sparse_layers = static_cast<int>(rows.back().expert_load.size());
            {
              std::ofstream out(data);
              for (const MetricsRow& r : rows) {
                out << fmt::format("{} {} {} {} {}", r.step, r.loss, r.tokens_per_s, r.grad_norm, r.val ? *r.val : -1.0);
                for (int l = 0; l < sparse_layers; ++l)
                  out << ' ' << (l < static_cast<int>(r.expert_load.size()) ? r.expert_load[static_cast<std::size_t>(l)] : 0.0);
                out << '\n';
              }
              std::ofstream(script) << plot_script(data.string(), png.string(), folder.filename().string(), sparse_layers);
            }
            run_gnuplot(folder, script, "report.log");
            double best_val = 1e300, tokens = 0;
            for (const MetricsRow& r : rows) {
              if (r.val) best_val = std::min(best_val, *r.val);
              tokens += r.tokens_per_s;
            }
            std::string load;
            if (sparse_layers > 0)
              load = fmt::format(", expert load (max / mean) per sparse layer at the last step {:.2f}",
                                 fmt::join(rows.back().expert_load, " "));
            Log::info("run {}: {} logged steps, last step {}, loss {:.4f} -> {:.4f}{}, mean {:.0f} tokens/s, last grad "
                      "norm {:.3f}{}\nwrote {}", folder.string(), rows.size(), rows.back().step, rows.front().loss,
                      rows.back().loss, best_val < 1e300 ? fmt::format(", best validation loss {:.4f}", best_val) : "",
                      tokens / rows.size(), rows.back().grad_norm, load, png.string());
            return 0;
          },
          [] { return false; }};
}

}  // namespace fsdpp::app
