# scripts/bench/mpi_common.sh: sourced by the benchmarks that run OpenMPI beside our collectives
# (scripts/bench/compare_mpi.sh, scripts/bench_algo.sh). OpenMPI is a comparator only, never a
# dependency: mpi_build compiles build/mpi_bench where mpicc and mpirun exist and sets HAVE_MPI (1 or
# 0, saying why once); MPIRUN is the one-node launch.
HAVE_MPI=0
mpi_build() {
    if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
        mkdir -p build
        mpicc -O3 -std=gnu11 -Wall -Wextra -Werror scripts/bench/mpi_bench.c -o build/mpi_bench && HAVE_MPI=1
    else
        echo "OpenMPI not installed: no MPI columns (apt-get install openmpi-bin libopenmpi-dev)"
    fi
}
# --oversubscribe: more ranks than cores is allowed (and makes OpenMPI yield when idle instead of
# spinning); --bind-to none: no pinning of 4 ranks onto 2 cores; btl self,vader: shared memory only
# (no TCP, no InfiniBand probing), as our ranks use on one node.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
