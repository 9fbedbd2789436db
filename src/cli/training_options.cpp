#include "training_options.h"

#include <sstream>

#include "options.h"
#include "peertrain/core/error.h"

namespace peertrain::cli {
namespace {

// Flags forwarded from launch to its peers (everything that shapes the run).
const std::vector<std::string> kTrainingFlags = {
    "algorithm", "model", "hidden", "epochs", "max-steps", "batch", "lr", "momentum", "weight-decay", "seed",
    "eval-every", "partition", "alpha", "data-dir", "peer-timeout", "connect-timeout", "threads", "run-id", "on-split", "secret-file", "checkpoint-every", "checkpoint-dir"};

std::vector<int> parse_widths(const std::string& text) {
  std::vector<int> widths;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int w = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
    if (ec != std::errc() || ptr != item.data() + item.size() || w < 1 || w > 1 << 16)
      throw UsageError("--hidden '" + text + "' must be a comma-separated list of layer widths, e.g. 512,512");
    widths.push_back(w);
  }
  return widths;
}

template <typename T>
T positive(const cxxopts::ParseResult& args, const std::string& name, bool zero_ok = false) {
  const T value = number_flag<T>(args, name);
  if (value < 0 || (!zero_ok && value == 0))
    throw UsageError("--" + name + " must be " + (zero_ok ? "0 or more" : "positive") + ", got " +
                     args[name].as<std::string>());
  return value;
}

}  // namespace

void add_training_options(cxxopts::Options& options) {
  options.add_options("training")
      ("algorithm", "dpsgd | allreduce | ps | local", cxxopts::value<std::string>()->default_value("dpsgd"))
      ("model", "mlp", cxxopts::value<std::string>()->default_value("mlp"))
      ("hidden", "MLP hidden layer widths", cxxopts::value<std::string>()->default_value("512,512"))
      ("epochs", "passes over the training set (all peers together)", cxxopts::value<std::string>()->default_value("5"))
      ("max-steps", "stop after this many steps (0: no cap)", cxxopts::value<std::string>()->default_value("0"))
      ("batch", "examples per peer per step", cxxopts::value<std::string>()->default_value("32"))
      ("lr", "learning rate", cxxopts::value<std::string>()->default_value("0.05"))
      ("momentum", "SGD momentum", cxxopts::value<std::string>()->default_value("0.9"))
      ("weight-decay", "L2 weight decay", cxxopts::value<std::string>()->default_value("0.0001"))
      ("seed", "seed of the model, the shards and the batches", cxxopts::value<std::string>()->default_value("1"))
      ("eval-every", "steps between evaluations (0: once per epoch)", cxxopts::value<std::string>()->default_value("0"))
      ("partition", "iid | dirichlet", cxxopts::value<std::string>()->default_value("iid"))
      ("alpha", "Dirichlet concentration for --partition dirichlet", cxxopts::value<std::string>()->default_value("0.5"))
      ("data-dir", "Fashion-MNIST IDX files", cxxopts::value<std::string>()->default_value(train::kFashionMnistDir))
      ("peer-timeout", "seconds any wait for a peer may take", cxxopts::value<std::string>()->default_value("60"))
      ("connect-timeout", "seconds to wait for every peer to come up", cxxopts::value<std::string>()->default_value("60"))
      ("threads", "Eigen threads per peer", cxxopts::value<std::string>()->default_value("1"))
      ("run-id", "run id all peers share (default: derived from the configuration)",
       cxxopts::value<std::string>()->default_value("0"))
      ("on-split", "D-PSGD when lost peers split the graph: continue (each piece alone) | stop",
       cxxopts::value<std::string>()->default_value("continue"))
      ("checkpoint-every", "steps between checkpoints (0: none)", cxxopts::value<std::string>()->default_value("0"))
      ("checkpoint-dir", "where peers write checkpoints (default: OUT/checkpoints)", cxxopts::value<std::string>())
      ("resume", "restart every peer from the latest complete set of checkpoints")
      ("secret-file", "a key file every peer shares (16+ bytes); without it nobody can join or inject frames "
                      "(make one: head -c 32 /dev/urandom > run.key && chmod 600 run.key)",
       cxxopts::value<std::string>());
}

train::TrainConfig training_config(const cxxopts::ParseResult& args) {
  train::TrainConfig c;
  try {
    c.algorithm = train::parse_algorithm(args["algorithm"].as<std::string>());
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (args["model"].as<std::string>() != "mlp")
    throw UsageError("--model '" + args["model"].as<std::string>() + "' is not available yet; use mlp");
  c.hidden = parse_widths(args["hidden"].as<std::string>());
  c.epochs = positive<int>(args, "epochs");
  c.max_steps = positive<long long>(args, "max-steps", true);
  c.batch = positive<int>(args, "batch");
  c.sgd.lr = positive<float>(args, "lr");
  c.sgd.momentum = positive<float>(args, "momentum", true);
  c.sgd.weight_decay = positive<float>(args, "weight-decay", true);
  if (c.sgd.momentum >= 1) throw UsageError("--momentum must be below 1");
  c.seed = number_flag<std::uint64_t>(args, "seed");
  c.eval_every = positive<long long>(args, "eval-every", true);
  const std::string partition = args["partition"].as<std::string>();
  if (partition == "iid") {
    c.partition = train::Partition::kIid;
  } else if (partition == "dirichlet") {
    c.partition = train::Partition::kDirichlet;
  } else {
    throw UsageError("--partition '" + partition + "' is not one of iid, dirichlet");
  }
  c.alpha = positive<double>(args, "alpha");
  c.data_dir = args["data-dir"].as<std::string>();
  c.peer_timeout_s = positive<double>(args, "peer-timeout");
  c.connect_timeout_s = positive<double>(args, "connect-timeout");
  c.threads = positive<int>(args, "threads");
  c.run_id = number_flag<std::uint64_t>(args, "run-id");
  const std::string split = args["on-split"].as<std::string>();
  if (split != "continue" && split != "stop") throw UsageError("--on-split '" + split + "' is not one of continue, stop");
  c.stop_on_split = split == "stop";
  if (args.count("secret-file")) c.secret_file = args["secret-file"].as<std::string>();
  c.checkpoint_every = positive<long long>(args, "checkpoint-every", true);
  if (args.count("checkpoint-dir")) c.checkpoint_dir = args["checkpoint-dir"].as<std::string>();
  c.resume = args.count("resume") > 0;
  return c;
}

std::vector<std::string> forwarded_training_flags(const cxxopts::ParseResult& args) {
  std::vector<std::string> out;
  if (args.count("resume")) out.push_back("--resume");
  for (const std::string& name : kTrainingFlags)
    if (args.count(name)) {
      out.push_back("--" + name);
      out.push_back(args[name].as<std::string>());
    }
  return out;
}

}  // namespace peertrain::cli
