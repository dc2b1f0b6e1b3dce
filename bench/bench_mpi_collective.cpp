// The speed of an MPI collective itself, with nothing of Trident between the loop and the
// library: `calls` collectives over `kib` KiB of fp32 per round (the whole buffer: the
// all-reduce's, the all-gather's output, the reduce-scatter's input), after 20 untimed,
// over MPI_COMM_WORLD; rank 0 prints each round's time and bus bandwidth (nccl-tests'
// convention: 2(n-1)/n x bytes / time for the all-reduce, (n-1)/n x bytes / time for the
// others). KIND all: the three in turn in every round, in one process. Run it several times in a row to see how one machine's link speed differs
// between processes and within one, and the kinds side by side (docs/PERFORMANCE.md,
// "trident plan on CPU ranks: the least wait, and the link between runs").
//   mpirun -np 2 build/bench/bench_mpi_collective [allreduce|allgather|reduce_scatter|all]
//       [KiB, default 256] [calls, default 128] [rounds, default 5]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string kind = argc > 1 ? argv[1] : "allreduce";
  const long kib = argc > 2 ? std::atol(argv[2]) : 256;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 128;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  const long count = kib * 1024 / static_cast<long>(sizeof(float));
  const std::vector<std::string> kinds =
      kind == "all" ? std::vector<std::string>{"allreduce", "allgather", "reduce_scatter"}
                    : std::vector<std::string>{kind};
  const bool known = kind == "all" || kind == "allreduce" || kind == "allgather" || kind == "reduce_scatter";
  if (!known || kib <= 0 || calls <= 0 || rounds <= 0 || count % size != 0) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "bench_mpi_collective: KIND is allreduce, allgather, reduce_scatter or all; KiB, calls "
                   "and rounds are positive, and the KiB's floats divide by the %d ranks\n",
                   size);
    }
    MPI_Finalize();
    return 2;
  }
  std::vector<float> buf(static_cast<size_t>(count), 1.0f), part(static_cast<size_t>(count / size), 1.0f);
  const int n = static_cast<int>(count), chunk = static_cast<int>(count / size);
  auto once = [&](const std::string& k) {
    if (k == "allreduce") {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (k == "allgather") {
      MPI_Allgather(part.data(), chunk, MPI_FLOAT, buf.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
    } else {
      MPI_Reduce_scatter_block(buf.data(), part.data(), chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  };
  for (const std::string& k : kinds) {
    for (int i = 0; i < 20; ++i) once(k);
  }
  for (int r = 0; r < rounds; ++r) {
    for (const std::string& k : kinds) {
      const double factor = (k == "allreduce" ? 2.0 : 1.0) * (size - 1) / size;
      const double bus = factor * static_cast<double>(kib) * 1024 * calls;
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < calls; ++i) once(k);
      const double t = MPI_Wtime() - t0;
      if (rank == 0) {
        std::printf("%d ranks, %d %s of %ld KiB: %.2f ms (%.2f GB/s bus)\n", size, calls, k.c_str(), kib,
                    t * 1e3, bus / t / 1e9);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
