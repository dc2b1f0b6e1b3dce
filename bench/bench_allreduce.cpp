// The speed of MPI_Allreduce itself, with nothing of Trident between the loop and the
// library: `calls` all-reduces of `kib` KiB of fp32 per round, after 20 untimed, over
// MPI_COMM_WORLD; rank 0 prints each round's time and bus bandwidth (2(n-1)/n x bytes
// / time, nccl-tests' convention). Run it several times in a row to see how one
// machine's link speed differs between processes and within one
// (docs/PERFORMANCE.md, "trident plan on CPU ranks: the link between runs").
//   mpirun -np 2 build/bench/bench_allreduce [KiB, default 256] [calls, default 128] [rounds, default 5]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long kib = argc > 1 ? std::atol(argv[1]) : 256;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 128;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (kib <= 0 || calls <= 0 || rounds <= 0) {
    if (rank == 0) std::fprintf(stderr, "bench_allreduce: KiB, calls and rounds must be positive\n");
    MPI_Finalize();
    return 2;
  }
  std::vector<float> buf(static_cast<size_t>(kib) * 1024 / sizeof(float), 1.0f);
  const int n = static_cast<int>(buf.size());
  for (int i = 0; i < 20; ++i) MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double bus = 2.0 * (size - 1) / size * static_cast<double>(kib) * 1024 * calls;
  for (int r = 0; r < rounds; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < calls; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    const double t = MPI_Wtime() - t0;
    if (rank == 0) {
      std::printf("%d ranks, %d all-reduces of %ld KiB: %.2f ms (%.2f GB/s bus)\n", size, calls, kib,
                  t * 1e3, bus / t / 1e9);
    }
  }
  MPI_Finalize();
  return 0;
}
