/* bench/mpi_coll_bench.c — the MPI twin of ami_coll_bench.cpp: latency of
 * MPI_Barrier, an 8-byte MPI_Allreduce and a 1 MiB MPI_Allreduce (sums of
 * doubles) over MPI_COMM_WORLD, measured the same way: warm-up, then
 * repetitions of back-to-back iterations, each after a barrier; rank 0
 * prints the median time per iteration:
 *   barrier <usec>
 *   allreduce_8 <usec>
 *   allreduce_1m <usec>
 *   allreduce_<bytes> <usec>     for each size of --sweep
 * bench/coll_vs_mpi.sh builds it with mpicc.
 *
 * usage: mpi_coll_bench [--iters N] [--large-iters N] [--reps R] [--sweep BYTES,BYTES,...]
 *   --sweep: allreduce at these sizes too (multiples of 8 up to 1 MiB),
 *   each with N * 64 / bytes iterations, at least the large ones. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kLarge = 131072, kMaxReps = 101, kMaxSweep = 32 };

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double x, y;
static double* send_buf;
static double* recv_buf;

static void op_barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }
static void op_small(void) { MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); }
static void op_large(void) { MPI_Allreduce(send_buf, recv_buf, kLarge, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); }
static int sweep_count;  /* doubles of the sweep size being measured */
static void op_sweep(void) { MPI_Allreduce(send_buf, recv_buf, sweep_count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); }

/* "64,512,4096" -> sizes[]; 0 unless every one is a multiple of 8 in 8..1 MiB. */
static int parse_sizes(const char* list, long* sizes, int* n) {
  const char* p = list;
  while (*p) {
    char* end = NULL;
    long v = strtol(p, &end, 10);
    if (end == p || v < 8 || v > 8L * kLarge || v % 8 != 0 || *n >= kMaxSweep) return 0;
    sizes[(*n)++] = v;
    if (*end == ',') ++end;
    else if (*end != '\0') return 0;
    p = end;
  }
  return *n > 0;
}

static double measure(int iters, int reps, void (*op)(void)) {
  double per_iter[kMaxReps];
  int warm = iters / 10 > 10 ? iters / 10 : 10;
  for (int i = 0; i < warm; ++i) op();
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) op();
    per_iter[r] = (MPI_Wtime() - t0) * 1e6 / iters;
  }
  qsort(per_iter, (size_t)reps, sizeof per_iter[0], cmp);
  return per_iter[reps / 2];
}

int main(int argc, char** argv) {
  int iters = 10000, large_iters = 200, reps = 11, rank = 0, size = 1, nsweep = 0;
  long sweep[kMaxSweep];
  double swept[kMaxSweep];
  MPI_Init(&argc, &argv);
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = atoi(argv[++i]);
    else if (strcmp(argv[i], "--large-iters") == 0 && i + 1 < argc) large_iters = atoi(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--yield") == 0) { /* Open MPI yields by itself when oversubscribed */ }
    else if (strcmp(argv[i], "--sweep") == 0 && i + 1 < argc && parse_sizes(argv[i + 1], sweep, &nsweep)) ++i;
    else {
      fprintf(stderr, "usage: %s [--iters N] [--large-iters N] [--reps R] [--sweep BYTES,...]\n", argv[0]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (iters <= 0 || large_iters <= 0 || reps <= 0 || reps > kMaxReps) MPI_Abort(MPI_COMM_WORLD, 2);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  x = 1.0 + rank;
  send_buf = malloc(kLarge * sizeof(double));
  recv_buf = malloc(kLarge * sizeof(double));
  for (int i = 0; i < kLarge; ++i) send_buf[i] = 1.0 + rank;
  double barrier = measure(iters, reps, op_barrier);
  double small = measure(iters, reps, op_small);
  double large = measure(large_iters, reps, op_large);
  for (int k = 0; k < nsweep; ++k) {
    long n = (long)iters * 64 / sweep[k];
    if (n > iters) n = iters;
    if (n < large_iters) n = large_iters;
    sweep_count = (int)(sweep[k] / 8);
    swept[k] = measure((int)n, reps, op_sweep);
  }
  if (rank == 0) {
    printf("barrier %.3f\nallreduce_8 %.3f\nallreduce_1m %.3f\n", barrier, small, large);
    for (int k = 0; k < nsweep; ++k) printf("allreduce_%ld %.3f\n", sweep[k], swept[k]);
    if (y != size * (size + 1) / 2.0 || recv_buf[12345] != y) fprintf(stderr, "mpi_coll_bench: wrong result\n");
  }
  free(send_buf);
  free(recv_buf);
  MPI_Finalize();
  return 0;
}
