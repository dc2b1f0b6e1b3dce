// `trident train --config FILE [--set section.key=value ...] [--resume auto|none|DIR]`
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/dir_check.h"
#include "checkpoint/manifest.h"
#include "cli/commands.h"
#include "comm/communicator.h"
#include "comm/nccl_world.h"
#include "comm/watchdog.h"
#include "config/config.h"
#include "config/dp_auto.h"
#include "core/check.h"
#include "core/log.h"
#include "trainer/signals.h"
#include "trainer/trainer.h"

namespace trident {

namespace {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string resume = "auto";
  bool help = false;
};

void print_train_usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: trident train --config FILE [--set section.key=value ...] [--resume auto|none|DIR]\n"
      "  --config FILE            the YAML config (docs/CONFIG.md)\n"
      "  --set section.key=value  overrides one config key; repeatable, applied in order\n"
      "  --resume auto|none|DIR   auto (default): continue the run checkpoint.dir/latest\n"
      "                           names; none: a new run (refused when checkpoint.dir holds\n"
      "                           checkpoints); DIR: that checkpoint (later steps in\n"
      "                           checkpoint.dir are set aside as step_N.abandoned)\n"
      "  -h, --help               this text\n"
      "exit codes: 0 done, 1 failure, 2 bad usage/config/input, 3 stopped by a signal\n"
      "signals: SIGTERM, SIGINT, SIGHUP or SIGUSR1 saves a checkpoint at the next step\n"
      "  boundary and exits 3; a second one (0.5 s or more later) exits at once without\n"
      "  saving (128 + signal number); one during start-up (before the first step) exits 3\n"
      "  at once, nothing to save\n");
}

Result<TrainArgs> parse_train_args(const std::vector<std::string>& args) {
  TrainArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> Result<std::string> {
      if (i + 1 >= args.size()) return Status::invalid_config(std::string(flag) + " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      out.help = true;
      return out;
    } else if (a == "--config") {
      TRIDENT_ASSIGN_OR_RETURN(out.config_path, value("--config"));
    } else if (a == "--set") {
      TRIDENT_ASSIGN_OR_RETURN(std::string kv, value("--set"));
      out.overrides.push_back(kv);
    } else if (a == "--resume") {
      TRIDENT_ASSIGN_OR_RETURN(out.resume, value("--resume"));
    } else {
      return Status::invalid_config("train: unknown argument '" + a +
                                    "' (allowed: --config FILE, --set section.key=value, "
                                    "--resume auto|none|DIR; see trident train --help)");
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

// Every rank writes its own rank file into checkpoint.dir, so every rank checks it; the
// ranks agree, so all exit 2 together instead of the others hanging in their first
// collective. A failing rank prints its own reason; rank 0, when it could write, says
// that others could not.
int check_checkpoint_dir(Communicator& world, const std::string& dir) {
  Status st = check_checkpoint_dir_writable(dir);
  std::int64_t failed = st.is_ok() ? 0 : 1;
  world.all_reduce(CommBuf::host(std::span<std::int64_t>(&failed, 1)), ReduceOp::kSum,
                   {.label = "checkpoint.dir check"});
  if (failed == 0) return 0;
  if (!st.is_ok()) {
    if (world.size() > 1) st = st.with_context("rank " + std::to_string(world.rank()));
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
  } else if (world.rank() == 0) {
    std::fprintf(stderr, "error: another rank cannot write checkpoint.dir %s (%lld of %d ranks "
                 "failed; each printed its reason)\n", dir.c_str(),
                 static_cast<long long>(failed), world.size());
  }
  return 2;
}

}  // namespace

int cmd_train(const std::vector<std::string>& args) {
  // Start-up mode first: a stop signal while MPI starts, the config or data is read or a
  // checkpoint loads exits 3 at once; Trainer::run switches to a graceful stop.
  install_stop_signal_handlers();
  auto parsed = parse_train_args(args);
  if (parsed.is_ok() && parsed->help) {
    print_train_usage(stdout);
    return 0;
  }
  // One process per device: under mpirun or srun the world spans every rank.
  std::unique_ptr<Communicator> world = make_world_communicator(nullptr, nullptr);
  log::init(world->rank(), world->size());
  if (!parsed.is_ok()) return fail(parsed.status());
  const TrainArgs& ta = parsed.value();

  auto config = load_config(ta.config_path, ta.overrides);
  if (!config.is_ok()) return fail(config.status());
  // parallel.dp: auto takes the ranks this launch has (a run continued on fewer nodes).
  if (Status st = resolve_auto_dp(&config.value(), world->size()); !st.is_ok()) {
    return fail(st.with_context(ta.config_path));
  }
  // Child groups copy the default timeout when they are split off the world.
  world->set_default_timeout(std::chrono::seconds(config->parallel.comm_timeout_s));
  if (int code = check_checkpoint_dir(*world, config->checkpoint.dir); code != 0) return code;
  // On a hang: the line, then (CUDA runs) every NCCL communicator aborted, exit 1.
  Watchdog watchdog({.on_hang = nccl_watchdog_handler()});
  // Every rank's host, once: a hang message then names the host of the peer it waited for.
  watchdog.learn_hosts(*world);

  TrainerOptions options;
  options.world = world.get();
  options.resume = ta.resume;
  options.watchdog = &watchdog;
  // Fault injection for the failure tests: TRIDENT_FAULT_HANG=<rank>:<step> makes that
  // rank stop responding at the start of that step (its peers' watchdogs must end the job).
  if (const char* hang = std::getenv("TRIDENT_FAULT_HANG")) {
    std::sscanf(hang, "%d:%d", &options.hang_rank, &options.hang_step);
  }
  // TRIDENT_FAULT_SAVE_STALL=<rank>:<step>:<marker>: that rank's writer stops for good
  // after the first 4 KiB chunk of its file of checkpoint step_<step> (the save stays
  // half-written, never committed), says so on stderr and creates the file <marker>; a
  // launch that finds <marker> does not stall (the retry after the drill's kill).
  if (const char* stall = std::getenv("TRIDENT_FAULT_SAVE_STALL")) {
    int stall_rank = -1;
    long long stall_step = -1;
    int marker_at = 0;
    if (std::sscanf(stall, "%d:%lld:%n", &stall_rank, &stall_step, &marker_at) == 2 &&
        marker_at > 0 && stall_rank == world->rank() && !std::filesystem::exists(stall + marker_at)) {
      const std::string marker = stall + marker_at;
      const std::string file = config->checkpoint.dir + "/" + step_dir_name(stall_step) +
                               ".tmp/" + rank_file_name(stall_rank);
      options.checkpoint_chunk_bytes = 4096;
      options.checkpoint_chunk_hook = [file, marker](int64_t written, int64_t total) {
        if (std::filesystem::exists(file)) {
          std::FILE* m = std::fopen(marker.c_str(), "w");
          if (m) std::fclose(m);
          std::fprintf(stderr, "trident: fault injection: rank file %s stalls after %lld of %lld "
                       "bytes (TRIDENT_FAULT_SAVE_STALL)\n", file.c_str(),
                       static_cast<long long>(written), static_cast<long long>(total));
          std::fflush(stderr);
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        return Status::ok();
      };
    }
  }
  auto trainer = Trainer::create(std::move(config).value(), options);
  if (!trainer.is_ok()) return fail(trainer.status());
  Status st = trainer.value()->run();
  if (!st.is_ok()) return fail(st);
  return trainer.value()->stopped_by_signal() ? 3 : 0;
}

}  // namespace trident
