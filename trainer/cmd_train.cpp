// `trident train --config FILE [--set section.key=value ...] [--resume auto|none|DIR]`
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "parallel/communicator.h"
#include "parallel/watchdog.h"
#include "trainer/commands.h"
#include "trainer/config.h"
#include "trainer/signals.h"
#include "trainer/trainer.h"

namespace trident {

namespace {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string resume = "auto";
};

Result<TrainArgs> parse_train_args(const std::vector<std::string>& args) {
  TrainArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> Result<std::string> {
      if (i + 1 >= args.size()) return Status::invalid_config(std::string(flag) + " needs a value");
      return args[++i];
    };
    if (a == "--config") {
      TRIDENT_ASSIGN_OR_RETURN(out.config_path, value("--config"));
    } else if (a == "--set") {
      TRIDENT_ASSIGN_OR_RETURN(std::string kv, value("--set"));
      out.overrides.push_back(kv);
    } else if (a == "--resume") {
      TRIDENT_ASSIGN_OR_RETURN(out.resume, value("--resume"));
    } else {
      return Status::invalid_config("train: unknown argument '" + a +
                                    "' (allowed: --config FILE, --set section.key=value, "
                                    "--resume auto|none|DIR)");
    }
  }
  if (out.config_path.empty()) return Status::invalid_config("train: --config FILE is required");
  return out;
}

int fail(const Status& status) {
  // Every rank fails alike on bad config; only rank 0 says so, unless the error is its own.
  if (process_identity().rank == 0 || status.code() != StatusCode::kInvalidConfig) {
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
  }
  return status.exit_code();
}

}  // namespace

int cmd_train(const std::vector<std::string>& args) {
  // One process per device: under mpirun or srun the world spans every rank.
  std::unique_ptr<Communicator> world = make_world_communicator(nullptr, nullptr);
  log::init(world->rank(), world->size());
  auto parsed = parse_train_args(args);
  if (!parsed.is_ok()) return fail(parsed.status());
  const TrainArgs& ta = parsed.value();

  auto config = load_config(ta.config_path, ta.overrides);
  if (!config.is_ok()) return fail(config.status());
  install_stop_signal_handlers();
  // Child groups copy the default timeout when they are split off the world.
  world->set_default_timeout(std::chrono::seconds(config->parallel.comm_timeout_s));
  Watchdog watchdog;

  TrainerOptions options;
  options.world = world.get();
  options.resume = ta.resume;
  options.watchdog = &watchdog;
  // Fault injection for the failure tests: TRIDENT_FAULT_HANG=<rank>:<step> makes that
  // rank stop responding at the start of that step (its peers' watchdogs must end the job).
  if (const char* hang = std::getenv("TRIDENT_FAULT_HANG")) {
    std::sscanf(hang, "%d:%d", &options.hang_rank, &options.hang_step);
  }
  auto trainer = Trainer::create(std::move(config).value(), options);
  if (!trainer.is_ok()) return fail(trainer.status());
  Status st = trainer.value()->run();
  if (!st.is_ok()) return fail(st);
  return trainer.value()->stopped_by_signal() ? 3 : 0;
}

}  // namespace trident
