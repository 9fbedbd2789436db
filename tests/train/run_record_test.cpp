// The run's files as types: each written and read back on fresh random values, every field
// compared; readers that name the file and the field; the report's inlined JSON that
// cannot end its <script> element.
#include "peertrain/train/run_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "peertrain/core/error.h"

namespace peertrain::train {
namespace {

namespace fs = std::filesystem;

class RunRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("run_record_test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  fs::path dir_;
  std::mt19937 rng_{11};
  double real() { return std::uniform_real_distribution<double>(-1e3, 1e3)(rng_); }
  int small() { return std::uniform_int_distribution<int>(0, 63)(rng_); }
};

RunSummary random_summary(std::mt19937& rng, bool language_model) {
  std::uniform_real_distribution<double> u(0, 1e4);
  std::uniform_int_distribution<int> id(0, 31);
  RunSummary s;
  s.topology = "ring \"8\"\n</script>";
  s.algorithm = "dpsgd";
  s.model = language_model ? "gpt" : "mlp";
  s.peers = id(rng) + 1;
  s.steps = id(rng) * 1000 + 7;
  s.epochs = u(rng);
  s.batch_per_peer = id(rng) + 1;
  s.test_accuracy = u(rng);
  s.mean_local_accuracy = u(rng);
  s.consensus_distance = u(rng) * 1e-9;
  s.final_train_loss = u(rng);
  s.wall_s = u(rng);
  s.mean_compute_s = u(rng);
  s.mean_comm_wait_s = u(rng);
  s.bytes_sent_per_peer = std::floor(u(rng) * 1e6);
  s.survivors = id(rng);
  s.items_per_s = u(rng);
  s.spectral_gap = u(rng) / 1e4;
  if (language_model) {
    s.val_bits_per_byte = u(rng);
    s.layout = LayoutRecord{2, 1, 2, "sp=2,tp=1;sp=2,tp=1", "send-recv", 4};
    s.algorithm = "diloco";
    s.diloco = DilocoRecord{id(rng) + 1, u(rng), u(rng), "nesterov", "gossip", "int8", id(rng), id(rng), u(rng)};
  } else {
    s.update = "atc";
    s.momentum_form = "quasi-global";
  }
  s.failed_peers = {id(rng), id(rng)};
  s.failures = {{id(rng), id(rng) * 10, "silent for 12 s, \"stalled\""}};
  s.rejoined_peers = {{id(rng), id(rng), id(rng)}};
  s.coordinator = id(rng);
  s.takeovers = {{1, 40, 0}, {2, 90, 1}};
  return s;
}

TEST_F(RunRecord, ASummaryRoundTripsEveryField) {
  for (bool language_model : {false, true}) {
    const RunSummary written = random_summary(rng_, language_model);
    write_summary(dir_, written);
    const RunSummary read = read_summary(dir_ / "summary.json");
    EXPECT_TRUE(read == written) << summary_text(read) << "\nagainst\n" << summary_text(written);
  }
}

TEST_F(RunRecord, AFailedRunsSummaryHasItsErrorAndNoFigures) {
  RunSummary failed;
  failed.topology = "ring8";
  failed.algorithm = "allreduce";
  failed.failed_peers = {3};
  failed.error = "peer 3 exited with code 1";
  write_summary(dir_, failed);
  EXPECT_TRUE(read_summary(dir_ / "summary.json") == failed);
  EXPECT_EQ(summary_text(failed).find("test_accuracy"), std::string::npos);
}

// One field a line: what a person (or grep) reads.
TEST_F(RunRecord, TheSummaryHasOneFieldALine) {
  const std::string text = summary_text(random_summary(rng_, false));
  EXPECT_NE(text.find("\n  \"failed_peers\": ["), std::string::npos) << text;
  EXPECT_NE(text.find("\n  \"takeovers\": [{\"peer\":1,\"step\":40,\"from\":0},"), std::string::npos) << text;
}

TEST_F(RunRecord, AMissingOrMistypedFieldIsNamed) {
  write("missing.json", R"({"topology": "t", "algorithm": "dpsgd", "failed_peers": [], "model": "mlp"})");
  try {
    read_summary(dir_ / "missing.json");
    FAIL() << "a summary without peers was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kParse);
    EXPECT_NE(std::string(e.what()).find("missing.json: no field 'peers'"), std::string::npos) << e.what();
  }
  write("mistyped.json", R"({"topology": "t", "algorithm": 7, "failed_peers": []})");
  try {
    read_summary(dir_ / "mistyped.json");
    FAIL() << "a numeric algorithm was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field 'algorithm' is 7"), std::string::npos) << e.what();
  }
  write("not-json.json", "{\"topology\": ");
  EXPECT_THROW(read_summary(dir_ / "not-json.json"), Error);
  try {
    read_summary(dir_ / "absent.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
  }
}

TEST_F(RunRecord, MetricsRowsRoundTripByColumnName) {
  std::vector<MetricsRow> rows;
  for (int i = 0; i < 20; ++i) {
    MetricsRow r;
    r.step = small() * 10;
    r.epoch = std::round(real() * 1e4) / 1e4;
    r.peer = small();
    r.train_loss = std::stod(std::to_string(real()));
    r.test_accuracy = std::round(real() * 1e4) / 1e4;
    r.avg_accuracy = std::round(real() * 1e4) / 1e4;
    r.consensus_distance = 0.125;
    r.bytes_sent = std::floor(std::abs(real()) * 1e3);
    r.bytes_received = std::floor(std::abs(real()) * 1e3);
    r.wall_s = std::round(real() * 1e4) / 1e4;
    r.compute_s = std::round(real() * 1e4) / 1e4;
    r.comm_wait_s = std::round(real() * 1e4) / 1e4;
    if (i % 2) {
      r.test_bits_per_byte = std::round(real() * 1e5) / 1e5;
      r.avg_bits_per_byte = std::round(real() * 1e5) / 1e5;
    }
    rows.push_back(r);
  }
  std::string text = metrics_header() + "\n";
  for (const MetricsRow& r : rows) text += metrics_line(r) + "\n";
  write("metrics.csv", text);
  const std::vector<MetricsRow> back = read_metrics(dir_ / "metrics.csv");
  ASSERT_EQ(back.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(back[i].step, rows[i].step) << i;
    EXPECT_EQ(back[i].peer, rows[i].peer) << i;
    EXPECT_NEAR(back[i].train_loss, rows[i].train_loss, 1e-6 * std::abs(rows[i].train_loss)) << i;
    EXPECT_DOUBLE_EQ(back[i].test_accuracy, rows[i].test_accuracy) << i;
    EXPECT_DOUBLE_EQ(back[i].bytes_sent, rows[i].bytes_sent) << i;
    EXPECT_DOUBLE_EQ(back[i].comm_wait_s, rows[i].comm_wait_s) << i;
    EXPECT_EQ(back[i].avg_bits_per_byte.has_value(), rows[i].avg_bits_per_byte.has_value()) << i;
  }
}

// Columns are found by name: a file whose columns come in another order reads the same.
TEST_F(RunRecord, MetricsColumnsAreFoundByNameAndErrorsNameTheLine) {
  write("reordered.csv",
        "peer,step,epoch,train_loss,test_accuracy,avg_accuracy,consensus_distance,bytes_sent,"
        "bytes_received,wall_s,compute_s,comm_wait_s\n3,40,0.5,1.25,0.5,0.5,0.01,100,200,1,2,3\n");
  const auto rows = read_metrics(dir_ / "reordered.csv");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].peer, 3);
  EXPECT_EQ(rows[0].step, 40);
  EXPECT_FALSE(rows[0].avg_bits_per_byte);
  write("bad.csv", metrics_header() + "\n" + "1,0.1,0,x,0,0,0,0,0,0,0,0,,\n");
  try {
    read_metrics(dir_ / "bad.csv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.csv:2: train_loss 'x' is not a number"), std::string::npos) << e.what();
  }
  write("no-peer.csv", "step,epoch\n1,2\n");
  EXPECT_THROW(read_metrics(dir_ / "no-peer.csv"), Error);
}

TEST_F(RunRecord, EvaluationsRoundTripAndABrokenLineIsSkippedByName) {
  EvalRecord e;
  e.step = 120;
  e.epoch = real();
  e.wall_s = real();
  e.loss = real();
  e.avg_acc = real();
  e.consensus = real();
  e.coordinator = 1;
  e.lost = {4};
  e.rejoined = {2};
  e.peers = {{0, 120, real(), real(), 0, real(), real(), real(), real(), real()},
             {1, 120, real(), real(), 0, real(), real(), real(), real(), real()}};
  e.links = std::vector<double>{1e6, 2e6, 3e6};
  EvalRecord text_model = e;
  text_model.avg_acc.reset();
  text_model.avg_bpb = real();
  text_model.links.reset();
  write("evals.jsonl", eval_line(e) + "\n" + "{\"step\": 130, \"epo\n" + eval_line(text_model) + "\n");
  std::vector<std::string> skipped;
  const auto back =
      read_evals(dir_ / "evals.jsonl", [&](const std::string& where, const std::string&) { skipped.push_back(where); });
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(back[0] == e);
  EXPECT_TRUE(back[1] == text_model);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("evals.jsonl:2"), std::string::npos) << skipped[0];
}

// A crafted name or reason must not end the report's <script> element.
TEST_F(RunRecord, JsonForAScriptElementHasNoAngleBracket) {
  const std::string crafted = R"({"topology": "</script><script>alert(1)</script>", "n": [1, 2]})";
  const std::string safe = script_safe_json(crafted, "summary.json");
  EXPECT_EQ(safe.find('<'), std::string::npos) << safe;
  EXPECT_NE(safe.find("\\u003c/script>"), std::string::npos) << safe;
  EXPECT_THROW(script_safe_json("{\"a\": </script>", "summary.json"), Error);
  EvalRecord e;
  e.peers = {{0, 1, 0, 0, 0, 0, 0, 0, 0, 0}};
  EXPECT_EQ(evals_script_array({e}).find('<'), std::string::npos);
}

}  // namespace
}  // namespace peertrain::train
