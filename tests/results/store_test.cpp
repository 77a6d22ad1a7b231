#include <gtest/gtest.h>

#include <regex>

#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "../common/testutil.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/results/store.hpp"

using namespace fp8lab;
using namespace fp8lab::results;
namespace fs = std::filesystem;

namespace {
fs::path fresh(const std::string& name) {
  const fs::path p = test::temp_dir("fp8lab_store") / name;
  for (const auto& ext : {"", "-wal", "-shm"}) fs::remove(p.string() + ext);
  return p;
}
RunInfo info(const std::string& recipe, std::uint64_t seed) {
  RunInfo r;
  r.name = "test";
  r.kind = "image-classification";
  r.config_json = R"({"epochs": 2, "recipe": ")" + recipe + R"("})";
  r.recipe = recipe;
  r.loss_scale = "none";
  r.seed = seed;
  return r;
}
}  // namespace

TEST(Store, RecordsRunsMetricsAndTraces) {
  const fs::path p = fresh("a.db");
  std::int64_t id;
  {
    Store s(p.string());
    id = s.begin_run(info("fp32", 1));
    s.log_metric(id, 100, "test_accuracy", 80.5);
    s.log_metric(id, 200, "test_accuracy", 85.25);
    s.log_loss_scale(id, {{0, 16, false}, {1, 15, true}, {2, 15, false}});
    s.finish_run(id, results::RunStatus::finished, 85.25, "test_accuracy", 12.5);
    const auto id2 = s.begin_run(info("resnet32-mixed", 1));
    s.finish_run(id2, results::RunStatus::diverged, std::nullopt, "test_accuracy", 3.0);
  }
  Store s(p.string());  // reopened: everything persisted
  const auto all = s.runs();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].status, results::RunStatus::finished);
  EXPECT_EQ(*all[0].final_metric, 85.25);
  EXPECT_EQ(all[0].code_version, Store::code_version());
  EXPECT_EQ(all[0].machine, machine_description());
  EXPECT_NE(all[0].machine, "");
  // The project's version and the build's `git describe --always --dirty` (written at
  // every build by cmake/code_version.cmake), or "unknown" outside a git checkout.
  EXPECT_TRUE(std::regex_match(Store::code_version(), std::regex(R"(\d+\.\d+\.\d+\+([0-9a-f]{7,40}(-dirty)?|unknown))")))
      << Store::code_version();
  EXPECT_FALSE(all[1].final_metric.has_value());
  EXPECT_EQ(s.runs({.status = results::RunStatus::diverged}).size(), 1u);
  EXPECT_EQ(s.runs({.recipe = "fp32"}).size(), 1u);
  EXPECT_EQ(s.metric(id, "test_accuracy"), (std::vector<std::pair<std::int64_t, double>>{{100, 80.5}, {200, 85.25}}));
  EXPECT_EQ(s.loss_scale_trace(id).size(), 3u);
  EXPECT_TRUE(std::get<2>(s.loss_scale_trace(id)[1]));
  const std::string csv = to_csv(all);
  EXPECT_NE(csv.find("id,created,name"), std::string::npos);
  EXPECT_NE(csv.find(",fp32,none,1,finished,test_accuracy,85.25,"), std::string::npos) << csv;
  const std::string json = to_json(all);
  EXPECT_NE(json.find("\"epochs\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"final_metric\": null"), std::string::npos);
  EXPECT_NE(csv.find(",code_version,machine\n"), std::string::npos) << csv;
  const std::string machine_csv = csv_field(machine_description());
  EXPECT_NE(csv.find("," + machine_csv + "\n"), std::string::npos) << csv;
  EXPECT_NE(json.find("\"machine\": "), std::string::npos) << json;
}

namespace {
// Runs SQL on a store file directly, as another program (or an older fp8lab) would.
void sql(const fs::path& p, const std::string& text) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, text.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "") << " in " << text;
  sqlite3_free(err);
  sqlite3_close(db);
}
std::int64_t user_version(const fs::path& p) {
  sqlite3* db = nullptr;
  sqlite3_open(p.c_str(), &db);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, nullptr);
  const std::int64_t v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}
}  // namespace

// A store written before runs recorded their machine (schema version 2, as an older fp8lab
// made it) opens: its runs read machine "" and keep everything else, new runs record theirs.
TEST(Store, AVersion2StoreGainsTheMachineColumn) {
  const fs::path p = fresh("v2.db");
  sql(p, R"(
CREATE TABLE runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  created TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,
  config TEXT NOT NULL, recipe TEXT NOT NULL, loss_scale TEXT NOT NULL, seed INTEGER NOT NULL,
  code_version TEXT NOT NULL, status TEXT NOT NULL, final_metric REAL, metric_name TEXT,
  wall_seconds REAL NOT NULL DEFAULT 0, host TEXT NOT NULL, pid INTEGER NOT NULL);
CREATE TABLE metrics (
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL,
  name TEXT NOT NULL, value REAL NOT NULL);
INSERT INTO runs VALUES (1, '2026-11-28T00:00:00Z', 'test', 'image-classification', '{}', 'fp32', 'none', 3,
  '0.1.0+abc1234', 'finished', 88.5, 'test_accuracy', 12.0, 'vm', 1);
INSERT INTO metrics VALUES (1, 10, 'test_accuracy', 88.5);
PRAGMA user_version = 2;
PRAGMA application_id = 946236514;)");
  ASSERT_EQ(kApplicationId, 946236514);
  {
    Store s(p.string());
    const auto rows = s.runs();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].machine, "");
    EXPECT_EQ(rows[0].seed, 3u);
    EXPECT_EQ(*rows[0].final_metric, 88.5);
    EXPECT_EQ(rows[0].code_version, "0.1.0+abc1234");
    EXPECT_EQ(s.metric(1, "test_accuracy").size(), 1u);
    const auto id = s.begin_run(info("fp32", 4));
    EXPECT_EQ(s.runs()[1].id, id);
    EXPECT_EQ(s.runs()[1].machine, machine_description());
  }
  EXPECT_EQ(user_version(p), kSchemaVersion);
  EXPECT_NO_THROW(Store s(p.string()));  // and opens again as it is
}

// A run resumed on another processor says so: its steps came from both.
TEST(Store, ARunResumedOnAnotherMachineNamesBoth) {
  const fs::path p = fresh("resumed.db");
  const std::string here = machine_description();
  Store s(p.string());
  const auto other = s.begin_run(info("fp32", 1));
  const auto same = s.begin_run(info("fp32", 2));
  const auto old = s.begin_run(info("fp32", 3));
  for (const auto id : {other, same, old}) s.finish_run(id, RunStatus::stopped, std::nullopt, "", 1.0);
  sql(p, "UPDATE runs SET machine = 'Other CPU (family 1, model 2)' WHERE id = " + std::to_string(other) +
             "; UPDATE runs SET machine = '' WHERE id = " + std::to_string(old));
  const auto machine_of = [&](std::int64_t id) {
    for (const auto& r : s.runs())
      if (r.id == id) return r.machine;
    return std::string("?");
  };
  for (int round = 0; round < 2; ++round) {  // resumed here twice: named once
    for (const auto id : {other, same, old}) {
      s.resume_run(id, 0);
      s.finish_run(id, RunStatus::stopped, std::nullopt, "", 1.0);
    }
    EXPECT_EQ(machine_of(other), "Other CPU (family 1, model 2); resumed on " + here);
    EXPECT_EQ(machine_of(same), here);
    EXPECT_EQ(machine_of(old), "not recorded; resumed on " + here);
  }
}

// Tables and warnings name a run without a processor record "not recorded".
TEST(Store, MachineLabelNamesAMissingRecord) {
  EXPECT_EQ(machine_label(""), "not recorded");
  EXPECT_EQ(machine_label("Other CPU (family 1, model 2)"), "Other CPU (family 1, model 2)");
}

TEST(Store, KilledRunIsMarkedIncomplete) {
  const fs::path p = fresh("k.db");
  const pid_t child = fork();
  if (child == 0) {
    Store s(p.string());
    s.begin_run(info("fp32", 7));
    _exit(0);  // dies without finishing the run
  }
  int st = 0;
  waitpid(child, &st, 0);
  Store s(p.string());
  const auto all = s.runs();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].status, results::RunStatus::incomplete);
  // A live run (this process) stays "running".
  s.begin_run(info("fp32", 8));
  Store again(p.string());
  EXPECT_EQ(again.runs({.status = results::RunStatus::running}).size(), 1u);
}

TEST(Store, TwoProcessesWritingAtOnceLoseNothing) {
  const fs::path p = fresh("c.db");
  { Store s(p.string()); }
  const int kRuns = 25, kMetrics = 40;
  pid_t kids[2];
  for (int k = 0; k < 2; ++k) {
    kids[k] = fork();
    if (kids[k] == 0) {
      try {
        Store s(p.string());
        for (int r = 0; r < kRuns; ++r) {
          const auto id = s.begin_run(info("proc" + std::to_string(k), static_cast<std::uint64_t>(r)));
          for (int m = 0; m < kMetrics; ++m) s.log_metric(id, m, "loss", m * 0.5);
          s.finish_run(id, results::RunStatus::finished, 1.0, "loss", 0.1);
        }
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
  }
  for (pid_t kid : kids) {
    int st = 0;
    waitpid(kid, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  Store s(p.string());
  const auto all = s.runs({.status = results::RunStatus::finished});
  EXPECT_EQ(all.size(), 2u * kRuns);
  for (const auto& r : all) EXPECT_EQ(s.metric(r.id, "loss").size(), static_cast<std::size_t>(kMetrics));
}

TEST(Store, RefusesFilesThatAreNotStores) {
  const fs::path p = fresh("junk.db");
  std::ofstream(p) << "this is not a database, just some text that is long enough to look like a header";
  try {
    Store s(p.string());
    ADD_FAILURE() << "opened a text file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.db"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Store("/nonexistent/dir/x.db"), Error);
}

TEST(Store, ChecksTheFileBeforeChangingAnything) {
  // Another program's SQLite database: refused, and byte for byte unchanged.
  const fs::path other = fresh("other.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE notes (t TEXT); INSERT INTO notes VALUES ('mine');", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = slurp(other);
  const std::string e = test::error_of([&] { Store s(other.string()); });
  EXPECT_NE(e.find("not an fp8lab results store; nothing was changed"), std::string::npos) << e;
  EXPECT_EQ(slurp(other), before);
  EXPECT_FALSE(fs::exists(other.string() + "-wal"));
  // Not SQLite at all.
  const fs::path text = fresh("text.db");
  std::ofstream(text) << "hello, this is not a database, but it is long enough to look like a header\n";
  EXPECT_NE(test::error_of([&] { Store s(text.string()); }).find("not an fp8lab results store (not an SQLite database)"),
            std::string::npos);
  // An empty file becomes a store.
  const fs::path empty = fresh("empty.db");
  std::ofstream(empty).close();
  EXPECT_NO_THROW(Store s(empty.string()));
}

TEST(Store, ADamagedStoreIsRefusedBeforeItIsWritten) {
  const fs::path p = fresh("damaged.db");
  {
    Store s(p.string());
    for (int r = 0; r < 20; ++r) {
      const auto id = s.begin_run(info("fp32", static_cast<std::uint64_t>(r)));
      for (int k = 0; k < 200; ++k) s.log_metric(id, k, "test_accuracy", 0.5 * k);
      s.finish_run(id, RunStatus::finished, 1.0, "test_accuracy", 1.0);
    }
    EXPECT_EQ(s.check(), "");
  }
  {
    sqlite3* db = nullptr;  // fold the WAL into the file, as a closed store would be copied
    ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  const auto size = fs::file_size(p);
  ASSERT_GT(size, 64u * 1024);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2 / 4096 * 4096));
    std::mt19937 rng(3);
    for (int i = 0; i < 4096; ++i) f.put(static_cast<char>(rng()));
  }
  const std::string e = test::error_of([&] { Store s(p.string()); });
  EXPECT_NE(e.find("the results store is damaged"), std::string::npos) << e;
  EXPECT_NE(e.find("nothing was written"), std::string::npos) << e;
}
