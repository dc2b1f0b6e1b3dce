// How long training is blocked per checkpoint: an asynchronous save (CheckpointWriter::save
// returns once the state is copied into the writer's host buffer; write + fsync run on the
// writer's thread) against a synchronous save of the same state (save returns after
// write + fsync + commit). The state is the real trainer state of one preset model: every
// parameter and both AdamW moments, as the boxes trainer/checkpointing.h hands to the
// writer in one process (ZeRO-0, one rank).
//
// Columns (ms, min and median over --reps, after one untimed warm-up save per mode):
//   save      the training thread inside save(): async, the snapshot (SaveStats::
//             snapshot_ms) plus the step directory's setup; sync, everything
//   commit    SaveStats::commit_ms: manifest, renames, fsyncs, retention. Async, the
//             trainer runs it on the training thread too, in the poll() of the first step
//             boundary after the write finished, so
//   blocked   = save + commit for async (= save for sync) is what a checkpoint costs the
//             training thread in all
//   write     SaveStats::write_ms (checksums, write, fsync of the rank file)
//   total     save() until committed (async: save + wait)
//   wrong     saves that failed verify_checkpoint (every checksum) or did not read back
//             bitwise equal to the source, tensor by tensor.
// Prints a '#' header and a fixed-width table.
//
//   build/bench/bench_checkpoint [--preset small|medium] [--reps N] [--keep N] [--dir DIR]
//                                [--verbose]
// --keep is checkpoint.keep_last (default 3, the trainer's; 0 keeps all, so no deletions
// in commit); --dir is where the checkpoints go (default /tmp; the bench writes into a new
// trident_bench_checkpoint.<pid> there and deletes it at the end); --verbose prints every
// repetition to stderr.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/presets.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "comm/communicator.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/ops.h"
#include "model/transformer.h"
#include "parallel/data_parallel.h"
#include "trainer/checkpointing.h"

namespace trident {
namespace {

using bench::kPresets;
using bench::Preset;

struct Sample {
  double save_ms = 0;      // the training thread inside save()
  double snapshot_ms = 0;  // SaveStats
  double write_ms = 0;
  double commit_ms = 0;
  double total_ms = 0;     // save() until committed (async: save + wait)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// Ok when the committed step verifies and every tensor reads back bitwise equal to the
// boxes it was saved from (each box here covers its whole tensor: one rank, ZeRO-0).
bool check_saved(const std::string& dir, int64_t step, const std::vector<BoxRef>& boxes, Ops& ops) {
  const std::string step_dir = dir + "/" + step_dir_name(step);
  Status st = verify_checkpoint(step_dir);
  if (!st.is_ok()) {
    std::fprintf(stderr, "verify %s: %s\n", step_dir.c_str(), st.message().c_str());
    return false;
  }
  auto ckpt = open_checkpoint(step_dir);
  if (!ckpt.is_ok()) return false;
  std::vector<float> back, saved;
  for (const BoxRef& b : boxes) {
    back.resize(static_cast<size_t>(volume(b.extent)));
    saved.resize(back.size());
    ops.download(saved.data(), b.data.device(), saved.size() * sizeof(float));
    st = ckpt.value().read_box(b.tensor, b.start, b.extent, back.data());
    if (!st.is_ok() || std::memcmp(back.data(), saved.data(), back.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "read back %s: %s\n", b.tensor.c_str(),
                   st.is_ok() ? "values differ" : st.message().c_str());
      return false;
    }
  }
  return true;
}

int run(int argc, char** argv) {
  std::string preset = "medium", parent = "/tmp";
  int reps = 5, keep = 3;
  bool verbose = false;
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--verbose")) {
      verbose = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--keep")) keep = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir")) parent = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--preset small|medium] [--reps N] [--keep N] [--dir DIR] [--verbose]\n", argv[0]);
      return 2;
    }
  }
  const Preset* p = nullptr;
  for (const Preset& q : kPresets) {
    if (preset == q.name) p = &q;
  }
  if (!p) {
    std::fprintf(stderr, "unknown preset '%s' (small|medium)\n", preset.c_str());
    return 2;
  }
  // Retention messages ("deleted step_N") would interleave with the table.
  spdlog::set_level(spdlog::level::warn);
  TransformerConfig c;
  c.arch = Arch::kGpt2;
  c.vocab_size = p->vocab;
  c.seq_len = p->seq_len;
  c.n_layers = p->n_layers;
  c.n_heads = p->n_heads;
  c.d_model = p->d_model;
  c.finalize();

  // The state `trident train` keeps in one process: ZeRO-0 over a one-rank group.
  auto ops = make_cpu_ops(1);
  SelfCommunicator self;
  const ModelPartition whole;
  const ParamLayout layout = describe_params(c, whole);
  DataParallel dp(layout, *ops, self, /*zero_stage=*/0, size_t{25} << 20, AdamWParams{});
  const uint64_t key = rng_key(11, 3);
  uint64_t counter = 0;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    dp.load_param(static_cast<int>(i), Transformer::initial_value(c, layout.params[i], 1));
    // Moments as after some training: nonzero, distinct values (not all-zero pages).
    const DataParallel::OwnedState st = dp.owned_state(static_cast<int>(i));
    std::vector<float> m(st.floats), v(st.floats);
    for (size_t k = 0; k < st.floats; ++k, ++counter) {
      m[k] = static_cast<float>(1e-3 * (uniform_at(key, counter) - 0.5));
      v[k] = static_cast<float>(1e-6 * uniform_at(key, counter + (uint64_t{1} << 40)));
    }
    ops->upload(st.exp_avg, m.data(), m.size() * sizeof(float));
    ops->upload(st.exp_avg_sq, v.data(), v.size() * sizeof(float));
  }
  const std::vector<BoxRef> boxes = checkpoint_boxes(layout, dp, RankCoords{}, 0);
  int64_t floats = 0;
  for (const BoxRef& b : boxes) floats += volume(b.extent);
  const double mib = static_cast<double>(floats) * sizeof(float) / (1 << 20);

  // A directory of our own under --dir: it is deleted at the end.
  const std::string dir = parent + "/trident_bench_checkpoint." + std::to_string(::getpid());
  std::error_code ec;
  CheckpointWriterOptions options;
  options.dir = dir;
  options.keep_last = keep;
  options.ops = ops.get();
  CheckpointWriter writer(options);
  const nlohmann::json trainer_state = {{"bench", "checkpoint"}};

  std::printf("# trident checkpoint save, preset %s (%d layers, d_model %d, seq_len %d, vocab %d): "
              "%zu tensors, %.1f M floats (params + AdamW m, v) = %.1f MiB; keep_last %d; "
              "%d reps after a warm-up; dir %s\n",
              p->name, p->n_layers, p->d_model, p->seq_len, p->vocab, boxes.size(), floats / 1e6,
              mib, keep, reps, dir.c_str());
  std::printf("# ms, min/median. save: inside save() (async: snapshot + setup). commit: runs on the "
              "training thread in both modes. blocked = save + commit (async), = save (sync).\n");
  std::printf("# %-6s %8s %10s %10s %10s %10s %10s %10s %10s %10s %7s %6s\n", "mode", "MiB", "save_min",
              "save_med", "snap_med", "commit_med", "blk_min", "blk_med", "write_med", "total_med",
              "GiB/s", "wrong");
  std::fflush(stdout);

  std::vector<Sample> samples[2];  // [0] async, [1] sync
  int wrong[2] = {0, 0};
  int64_t step = 0;
  // Alternate the modes so that drift in the page cache or disk affects both alike.
  // Repetition 0 is a warm-up, verified but not timed: the writer's first save faults in
  // its host buffer (~8x the steady snapshot time for medium).
  for (int r = 0; r <= reps; ++r) {
    for (int mode = 0; mode < 2; ++mode) {
      const bool async = mode == 0;
      ++step;
      Sample s;
      Timer total;
      Timer in_save;
      Status st = writer.save(step, boxes, trainer_state, self, async);
      s.save_ms = in_save.elapsed_ms();
      if (st.is_ok()) st = writer.wait();
      s.total_ms = total.elapsed_ms();
      const SaveStats& stats = writer.last_stats();
      s.snapshot_ms = stats.snapshot_ms;
      s.write_ms = stats.write_ms;
      s.commit_ms = stats.commit_ms;
      if (!st.is_ok()) {
        std::fprintf(stderr, "save step %lld: %s\n", static_cast<long long>(step), st.message().c_str());
      }
      if (!st.is_ok() || !check_saved(dir, step, boxes, *ops)) ++wrong[mode];
      if (r > 0) samples[mode].push_back(s);
      if (verbose) {
        std::fprintf(stderr, "# rep %d%s %-5s save %.2f snapshot %.2f commit %.2f write %.2f total %.2f ms\n",
                     r, r == 0 ? " (warm-up)" : "", async ? "async" : "sync", s.save_ms,
                     s.snapshot_ms, s.commit_ms, s.write_ms, s.total_ms);
      }
    }
  }
  for (int mode = 0; mode < 2; ++mode) {
    const bool async = mode == 0;
    std::vector<double> save, snap, commit, blocked, write, tot;
    for (const Sample& s : samples[mode]) {
      save.push_back(s.save_ms);
      snap.push_back(s.snapshot_ms);
      commit.push_back(s.commit_ms);
      blocked.push_back(async ? s.save_ms + s.commit_ms : s.save_ms);
      write.push_back(s.write_ms);
      tot.push_back(s.total_ms);
    }
    const double gib_s = mib / 1024.0 / (median(tot) / 1000.0);
    std::printf("  %-6s %8.1f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %7.2f %6d\n",
                async ? "async" : "sync", mib, minimum(save), median(save), median(snap),
                median(commit), minimum(blocked), median(blocked), median(write), median(tot),
                gib_s, wrong[mode]);
  }
  std::filesystem::remove_all(dir, ec);
  return wrong[0] + wrong[1] == 0 ? 0 : 1;
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) { return trident::run(argc, argv); }
