#include "fsdpp/observe/flight_analysis.hpp"

#include "fsdpp/runtime/rank_names.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>

namespace fsdpp {
namespace {

struct Record {
  std::uint64_t seq = 0;
  std::string op, dtype, site, state;
  std::uint64_t count = 0;
  std::int64_t step = 0;
  std::optional<double> issued_s, started_s, completed_s;
  bool finished() const { return state == "completed" || state == "failed"; }
};

// A communicator as every rank can name it: its label and its members' world ranks.
struct Group {
  std::string label;
  std::vector<int> ranks;
  bool operator<(const Group& o) const { return std::tie(label, ranks) < std::tie(o.label, o.ranks); }
};

struct Dump {
  int rank = 0, world_size = 1;
  std::string host, reason;
  double dumped_at_s = 0;
  std::vector<int> not_answering;
  std::vector<std::string> hosts;
  std::map<Group, std::vector<Record>> records;  // per group, by sequence number
  std::map<Group, std::uint64_t> issued;         // per group: the last sequence number issued
};

std::optional<double> optional_time(const nlohmann::json& j) {
  return j.is_null() ? std::nullopt : std::optional<double>(j.get<double>());
}

Dump read_dump(const std::filesystem::path& path) {
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  if (j.value("format", "") != "fsdpp-flight 1") throw std::runtime_error("not an fsdpp flight dump");
  Dump d;
  d.rank = j.at("rank").get<int>();
  d.world_size = j.at("world_size").get<int>();
  d.host = j.value("host", "");
  d.reason = j.value("reason", "");
  d.dumped_at_s = j.at("dumped_at_s").get<double>();
  d.not_answering = j.value("not_answering", std::vector<int>{});
  d.hosts = j.value("hosts", std::vector<std::string>{});
  std::map<std::uint32_t, Group> by_id;
  for (const auto& c : j.at("comms")) {
    const Group g{c.at("label").get<std::string>(), c.at("ranks").get<std::vector<int>>()};
    by_id[c.at("id").get<std::uint32_t>()] = g;
    d.issued[g] = c.at("issued").get<std::uint64_t>();
  }
  for (const auto& r : j.at("records")) {
    const auto group = by_id.find(r.at("comm").get<std::uint32_t>());
    if (group == by_id.end()) continue;
    Record rec;
    rec.seq = r.at("seq").get<std::uint64_t>();
    rec.op = r.at("op").get<std::string>();
    rec.dtype = r.at("dtype").get<std::string>();
    rec.site = r.value("site", "");
    rec.state = r.at("state").get<std::string>();
    rec.count = r.at("count").get<std::uint64_t>();
    rec.step = r.value("step", std::int64_t{0});
    rec.issued_s = optional_time(r.at("issued_s"));
    rec.started_s = optional_time(r.at("started_s"));
    rec.completed_s = optional_time(r.at("completed_s"));
    d.records[group->second].push_back(rec);
  }
  for (auto& [g, list] : d.records)
    std::sort(list.begin(), list.end(), [](const Record& a, const Record& b) { return a.seq < b.seq; });
  return d;
}

const Record* find_seq(const std::vector<Record>& list, std::uint64_t seq) {
  const auto it = std::lower_bound(list.begin(), list.end(), seq, [](const Record& r, std::uint64_t s) { return r.seq < s; });
  return it != list.end() && it->seq == seq ? &*it : nullptr;
}

// "all_gather of 27072 f32 (h.1 forward all-gather, step 3)"
std::string what(const Record& r) {
  std::string text = fmt::format("{} of {} {}", r.op, r.count, r.dtype);
  std::vector<std::string> about;
  if (!r.site.empty()) about.push_back(r.site);
  if (r.step > 0) about.push_back(fmt::format("step {}", r.step));
  if (!about.empty()) text += " (" + fmt::format("{}", fmt::join(about, ", ")) + ")";
  return text;
}

std::string group_name(const Group& g) { return fmt::format("{} (ranks {})", g.label, join_numbers(g.ranks)); }

std::string shorten(const std::string& text, std::size_t at_most = 160) {
  return text.size() <= at_most ? text : text.substr(0, at_most - 3) + "...";
}

struct Analysis {
  std::map<int, Dump> dumps;  // by rank
  int world_size = 0;
  std::vector<std::string> hosts;
};

// The first sequence number where the dumped members of a group issued different collectives.
std::optional<std::string> find_desync(const Analysis& a, const Group& g) {
  std::vector<const std::vector<Record>*> lists;
  std::vector<int> members;
  for (int r : g.ranks) {
    const auto d = a.dumps.find(r);
    if (d == a.dumps.end()) continue;
    const auto l = d->second.records.find(g);
    if (l == d->second.records.end() || l->second.empty()) continue;
    lists.push_back(&l->second);
    members.push_back(r);
  }
  if (lists.size() < 2) return std::nullopt;
  std::uint64_t first = 0, last = UINT64_MAX;  // the window every member still holds
  for (const auto* l : lists) {
    first = std::max(first, l->front().seq);
    last = std::min(last, l->back().seq);
  }
  for (std::uint64_t seq = first; seq <= last && last != UINT64_MAX; ++seq) {
    std::map<std::string, std::vector<int>> variants;  // what was issued -> by whom
    std::vector<std::string> order;
    for (std::size_t i = 0; i < lists.size(); ++i) {
      const Record* r = find_seq(*lists[i], seq);
      if (!r) continue;
      const std::string key = what(*r);
      if (!variants.count(key)) order.push_back(key);
      variants[key].push_back(members[i]);
    }
    if (variants.size() < 2) continue;
    std::vector<std::string> parts;
    for (const std::string& key : order) parts.push_back(fmt::format("{} issued {}", ranks_on_hosts(variants[key], a.hosts), key));
    return fmt::format("The ranks are desynchronised: on {}, collective #{} is not the same collective everywhere: {}. "
                       "Every earlier collective they both hold matches, so the ranks took different code paths just "
                       "before #{}; from there on their collectives pair up wrongly (wrong sizes, or a hang).",
                       group_name(g), seq, fmt::format("{}", fmt::join(parts, "; ")), seq);
  }
  return std::nullopt;
}

bool point_to_point(const Analysis& a, const Group& g) {
  for (const auto& [rank, d] : a.dumps)
    if (const auto l = d.records.find(g); l != d.records.end())
      for (const Record& r : l->second)
        if (r.op == "send" || r.op == "recv") return true;
  return false;
}

struct Hang {
  Group group;
  std::uint64_t seq = 0;
  Record record;
  double longest_wait_s = 0;
  std::string text;
};

// The oldest collective of group g that some dumped member started (or issued) and did not finish: the first
// such record met (members in order) among those with the lowest sequence number.
std::optional<Record> oldest_unfinished(const Analysis& a, const Group& g) {
  std::optional<Record> stuck;
  for (int r : g.ranks) {
    const auto d = a.dumps.find(r);
    if (d == a.dumps.end()) continue;
    const auto l = d->second.records.find(g);
    if (l == d->second.records.end()) continue;
    for (const Record& rec : l->second)
      if (!rec.finished() && (!stuck || rec.seq < stuck->seq)) stuck = rec;
  }
  return stuck;
}

// Where each member of a group stands against its collective #stuck.
struct Standing {
  std::vector<int> waiting, late, missing, through;
  std::vector<std::string> absent, through_at;  // dumped ranks that never entered it, with what they did last
  double shortest = 1e300, longest = 0;         // the waiters' waits when they dumped
};

Standing standing_at(const Analysis& a, const Group& g, std::uint64_t stuck, const std::set<int>& silent) {
  Standing s;
  for (int r : g.ranks) {
    const auto d = a.dumps.find(r);
    if (d == a.dumps.end()) {
      s.missing.push_back(r);
      continue;
    }
    const auto l = d->second.records.find(g);
    const Record* rec = l == d->second.records.end() ? nullptr : find_seq(l->second, stuck);
    const auto issued = d->second.issued.find(g);
    const std::uint64_t last = issued == d->second.issued.end() ? 0 : issued->second;
    if (rec || last >= stuck) {
      if (rec && rec->finished()) {  // it got through, and waits further on (or computes)
        s.through.push_back(r);
        for (const Record& later : l->second)
          if (later.seq > stuck && !later.finished()) {
            s.through_at.push_back(fmt::format("#{}", later.seq));
            break;
          }
        continue;
      }
      // Dumped, but too late for the rank that asked: it was stopped or stalled inside the collective.
      if (silent.count(r)) {
        s.late.push_back(r);
        continue;
      }
      s.waiting.push_back(r);
      const std::optional<double> since = rec ? (rec->started_s ? rec->started_s : rec->issued_s) : std::nullopt;
      if (since) {
        const double w = d->second.dumped_at_s - *since;
        s.shortest = std::min(s.shortest, w);
        s.longest = std::max(s.longest, w);
      }
      continue;
    }
    std::string did = last == 0 ? fmt::format("it has issued nothing on {}", g.label)
                                 : fmt::format("its last collective on {} is #{}", g.label, last);
    if (l != d->second.records.end() && !l->second.empty() && l->second.back().seq == last)
      did += fmt::format(", {}, {}", what(l->second.back()), l->second.back().state);
    s.absent.push_back(fmt::format("{} never entered it ({})", ranks_on_hosts({r}, a.hosts), did));
  }
  return s;
}

// One sentence on the stuck collective: who waits in it, who is late, through, absent or missing. (`s` by value:
// through_at is sorted and deduplicated here.)
std::string describe_hang(const Analysis& a, const Group& g, const Record& stuck, Standing s, bool aborted) {
  // Dumps taken while the run goes on (SIGUSR2) catch collectives in flight: only an abort makes it a hang.
  std::string text = fmt::format("{} {} collective #{}, {}: ", aborted ? "The job hangs in" : "In progress when dumped:",
                                 group_name(g), stuck.seq, what(stuck));
  std::vector<std::string> parts;
  if (!s.waiting.empty()) {
    std::string wait = s.waiting.size() == 1 ? "entered it and waits" : "entered it and wait";
    if (s.longest > 0)
      wait += s.shortest < s.longest - 0.05 ? fmt::format(" ({:.1f} to {:.1f} s when they dumped)", s.shortest, s.longest)
                                            : fmt::format(" ({:.1f} s when dumped)", s.longest);
    parts.push_back(fmt::format("{} {}", ranks_on_hosts(s.waiting, a.hosts), wait));
  }
  if (!s.late.empty())
    parts.push_back(fmt::format("{} entered it too but did not answer the request to dump in time: stopped or stalled "
                                "in it, the one{} the others wait for", ranks_on_hosts(s.late, a.hosts),
                                s.late.size() == 1 ? "" : "s"));
  if (!s.through.empty()) {
    std::sort(s.through_at.begin(), s.through_at.end());
    s.through_at.erase(std::unique(s.through_at.begin(), s.through_at.end()), s.through_at.end());
    parts.push_back(fmt::format("{} got through it{}", ranks_on_hosts(s.through, a.hosts),
                                s.through_at.empty() ? "" : fmt::format(" and wait in {}", fmt::join(s.through_at, ", "))));
  }
  for (const std::string& absent : s.absent) parts.push_back(absent);
  if (!s.missing.empty())
    parts.push_back(fmt::format("{} left no dump (stopped, gone, or cut off from the others), so it cannot be seen "
                                "to enter it: the ranks that wait are waiting for {}",
                                ranks_on_hosts(s.missing, a.hosts), s.missing.size() == 1 ? "it" : "them"));
  return text + fmt::format("{}", fmt::join(parts, "; ")) + ".";
}

// The oldest collective of group g that some dumped member started (or issued) and did not finish.
std::optional<Hang> find_hang(const Analysis& a, const Group& g, bool aborted, const std::set<int>& silent) {
  const std::optional<Record> stuck = oldest_unfinished(a, g);
  if (!stuck) return std::nullopt;
  const Standing s = standing_at(a, g, stuck->seq, silent);
  return Hang{g, stuck->seq, *stuck, s.longest, describe_hang(a, g, *stuck, s, aborted)};
}

// Every rank<r>.json in `dir`; the files that would not parse go to `unreadable`. Requires at least one dump.
Analysis read_dumps(const std::string& dir, std::vector<std::string>& unreadable) {
  Analysis a;
  std::error_code ec;
  const std::regex name(R"(rank([0-9]+)\.json)");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!std::regex_match(entry.path().filename().string(), name)) continue;
    try {
      Dump d = read_dump(entry.path());
      a.world_size = std::max(a.world_size, d.world_size);
      if (a.hosts.empty()) a.hosts = d.hosts;
      a.dumps[d.rank] = std::move(d);
    } catch (const std::exception& e) {
      unreadable.push_back(fmt::format("{} ({})", entry.path().filename().string(), e.what()));
    }
  }
  FSDPP_REQUIRE(!ec, "fsdpp debug flight: cannot read the folder '{}': {}", dir, ec.message());
  FSDPP_REQUIRE(!a.dumps.empty(), "fsdpp debug flight: no flight-recorder dump (rank<r>.json) in '{}'{}. Dumps are "
                "written to <run.output>/flight when the collective watchdog fires, when a rank aborts on an error, "
                "and on SIGUSR2", dir, unreadable.empty() ? "" : "; unreadable: " + fmt::format("{}", fmt::join(unreadable, ", ")));
  return a;
}

// The ranks that aborted, grouped by whom they found silent (sets in the order first met), each group with its
// first rank's message (the wait times aside).
struct Aborts {
  std::vector<std::vector<int>> silent_sets;
  std::map<std::vector<int>, std::vector<int>> aborted_by;  // silent set -> the ranks that found it so
  std::map<std::vector<int>, std::string> message_of;
};

Aborts group_aborts(const Analysis& a) {
  Aborts ab;
  for (const auto& [rank, d] : a.dumps) {
    if (d.reason.rfind("aborting: ", 0) != 0) continue;
    std::vector<int> silent = d.not_answering;
    std::sort(silent.begin(), silent.end());
    if (!ab.aborted_by.count(silent)) {
      ab.silent_sets.push_back(silent);
      const std::string said = std::regex_replace(d.reason.substr(10), std::regex(R"(waited [0-9.]+ s, )"), "");
      ab.message_of[silent] = shorten(said.substr(0, said.find(';')));
    }
    ab.aborted_by[silent].push_back(rank);
  }
  return ab;
}

// A sentence per group of aborting ranks; two groups that each found the other silent while both dumped: the
// network between them.
void describe_aborts(const Analysis& a, Aborts& ab, std::vector<std::string>& sentences) {
  for (const std::vector<int>& silent : ab.silent_sets) {
    const std::vector<int>& ranks = ab.aborted_by[silent];
    std::string sentence = fmt::format("{} aborted the job ({}{})", ranks_on_hosts(ranks, a.hosts),
                                       ranks.size() > 1 ? fmt::format("rank {}: ", ranks.front()) : "", ab.message_of[silent]);
    if (!silent.empty()) sentence += fmt::format(" and found {} not answering", ranks_on_hosts(silent, a.hosts));
    sentences.push_back(sentence + ".");
  }
  auto within = [](const std::vector<int>& ranks, const std::vector<int>& silent) {
    return std::all_of(ranks.begin(), ranks.end(),
                       [&](int r) { return std::find(silent.begin(), silent.end(), r) != silent.end(); });
  };
  for (std::size_t i = 0; i < ab.silent_sets.size(); ++i)
    for (std::size_t j = i + 1; j < ab.silent_sets.size(); ++j) {
      const std::vector<int>&a_ranks = ab.aborted_by[ab.silent_sets[i]], &b_ranks = ab.aborted_by[ab.silent_sets[j]];
      if (within(b_ranks, ab.silent_sets[i]) && within(a_ranks, ab.silent_sets[j]))
        sentences.push_back(fmt::format("{} and {} each found the other silent although both dumped: the network "
                                        "between them is cut (a link or switch down), not the ranks.",
                                        ranks_on_hosts(a_ranks, a.hosts), ranks_on_hosts(b_ranks, a.hosts)));
    }
}

// A rank found not answering that dumped after the first abort was resumed or unstuck meanwhile (a stopped rank
// gets SIGCONT with the launcher's kill): its records are from after the hang, so the hang is read without them.
void drop_late_dumps(Analysis& a, const std::set<int>& silent_ranks, std::vector<std::string>& sentences) {
  double first_abort_s = 1e300;
  for (const auto& [rank, d] : a.dumps)
    if (d.reason.rfind("aborting: ", 0) == 0 && !silent_ranks.count(rank)) first_abort_s = std::min(first_abort_s, d.dumped_at_s);
  std::vector<int> dumped_late;
  for (const int r : silent_ranks)
    if (const auto d = a.dumps.find(r); d != a.dumps.end() && d->second.dumped_at_s > first_abort_s) dumped_late.push_back(r);
  if (!dumped_late.empty()) {
    sentences.push_back(fmt::format("{} dumped only after the job was aborted, having been found not answering: its "
                                    "records are from later and are left out below.", ranks_on_hosts(dumped_late, a.hosts)));
    for (const int r : dumped_late) a.dumps.erase(r);
  }
}

// What the groups' records show: the first desync, the hang waited on longest, and the messages ranks wait in.
struct Findings {
  std::optional<std::string> desync;
  std::optional<Hang> hang;
  std::vector<std::string> waiting;  // messages a rank waits in
};

Findings read_groups(const Analysis& a, const std::set<Group>& groups, bool aborted, const std::set<int>& silent_ranks) {
  Findings f;
  for (const Group& g : groups) {
    // Messages (a pipeline's sends and receives) are numbered per rank, not in step across the group: the k-th of
    // one rank need not be the k-th of another, so neither a desync nor a hang is read from their numbers (the
    // pipeline's own wait names the stage it waits on).
    if (point_to_point(a, g)) {
      for (const auto& [rank, d] : a.dumps)
        if (const auto l = d.records.find(g); l != d.records.end())
          for (const Record& r : l->second)
            if (r.state == "started")
              f.waiting.push_back(fmt::format("on {} rank {} waits in {} #{} of {} {} (step {})", group_name(g), rank,
                                              r.op, r.seq, r.count, r.dtype, r.step));
      continue;
    }
    if (!f.desync) f.desync = find_desync(a, g);
    if (auto h = find_hang(a, g, aborted, silent_ranks); h && (!f.hang || h->longest_wait_s > f.hang->longest_wait_s)) f.hang = h;
  }
  return f;
}

// Nothing found: say so, with where each group's issuing stands.
std::string nothing_found(const Analysis& a, const std::set<Group>& groups, bool aborted) {
  std::vector<std::string> where;
  for (const Group& g : groups) {
    std::uint64_t low = UINT64_MAX, high = 0;
    for (int r : g.ranks)
      if (const auto d = a.dumps.find(r); d != a.dumps.end() && d->second.issued.count(g)) {
        low = std::min(low, d->second.issued.at(g));
        high = std::max(high, d->second.issued.at(g));
      }
    if (high > 0) where.push_back(low == high ? fmt::format("{} at #{}", group_name(g), high)
                                              : fmt::format("{} at #{} to #{}", group_name(g), low, high));
  }
  const std::string last = where.empty() ? "" : fmt::format(" (last issued: {})", fmt::join(where, ", "));
  return aborted ? fmt::format("No collective is unfinished on any dumped rank and the ranks agree on "
                               "every collective they all hold: nothing hangs here{}.", last)
                 : fmt::format("No rank aborted: these dumps were taken while the run went on (SIGUSR2), "
                               "and the ranks agree on every collective they all hold{}.", last);
}

}  // namespace

std::string explain_flight_dumps(const std::string& dir) {
  std::vector<std::string> unreadable;
  Analysis a = read_dumps(dir, unreadable);

  std::vector<int> dumped, missing;
  for (int r = 0; r < a.world_size; ++r) (a.dumps.count(r) ? dumped : missing).push_back(r);
  std::vector<std::string> sentences;
  sentences.push_back(fmt::format("Flight records of a {}-rank job in {}: {} dumped{}.", a.world_size, dir,
                                  dumped.size() == static_cast<std::size_t>(a.world_size) ? "every rank" : ranks_on_hosts(dumped, a.hosts),
                                  missing.empty() ? "" : "; no dump from " + ranks_on_hosts(missing, a.hosts)));
  if (!unreadable.empty()) sentences.push_back(fmt::format("Unreadable: {}.", fmt::join(unreadable, ", ")));
  Aborts ab = group_aborts(a);
  describe_aborts(a, ab, sentences);

  std::set<int> silent_ranks;  // found not answering by a rank that aborted
  for (const std::vector<int>& silent : ab.silent_sets) silent_ranks.insert(silent.begin(), silent.end());
  drop_late_dumps(a, silent_ranks, sentences);
  bool aborted = false;
  for (const auto& [rank, d] : a.dumps)
    aborted = aborted || d.reason.rfind("aborting: ", 0) == 0 || d.reason.rfind("asked by", 0) == 0;
  std::set<Group> groups;
  for (const auto& [rank, d] : a.dumps)
    for (const auto& [g, list] : d.issued) groups.insert(g);
  const Findings f = read_groups(a, groups, aborted, silent_ranks);
  if (f.desync) sentences.push_back(*f.desync);
  if (f.hang) sentences.push_back(f.hang->text);
  if (!f.waiting.empty()) sentences.push_back(fmt::format("Messages unfinished: {}.", fmt::join(f.waiting, "; ")));
  if (!f.desync && (!f.hang || !aborted) && f.waiting.empty()) sentences.push_back(nothing_found(a, groups, aborted));
  for (std::string& sentence : sentences) sentence[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(sentence[0])));
  return fmt::format("{}", fmt::join(sentences, " "));
}

}  // namespace fsdpp
