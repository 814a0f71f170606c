// launch.h: how a process learns its place in the job (the torchrun-style or Slurm environment), and
// the `--nproc N` launcher (launch.c). The top of the communication chain (common -> sockets ->
// bootstrap -> transports -> algorithms -> collectives -> launch): it uses the bootstrap's LaunchEnv
// and status board and the sockets, and nothing below calls it.
#ifndef LLM4D_LAUNCH_H
#define LLM4D_LAUNCH_H

// A second stop signal sooner than this after the first is that one delivered twice (timeout(1) signals
// its child, then its process group), not a second stop: the rank's handler and the launcher both wait.
#define SAME_STOP_S 1.0

#include <stddef.h>

#include "bootstrap.h"

// Reads the torchrun-style variables (RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK
// MASTER_ADDR MASTER_PORT), or Slurm's (SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID
// SLURM_JOB_NODELIST; MASTER_ADDR overrides the first node of the list). Returns 0 when neither is
// set, with env describing a world of one; dies naming the variable when one is malformed.
int launch_env_read(LaunchEnv *env);
// Expands a Slurm host list ("gpu[01-04,07],login2") and returns its first host in out.
void slurm_first_host(const char *nodelist, char *out, size_t cap);

// How a `--nproc` job ended: every rank succeeded; a rank failed (crashed, timed out, stopped with an
// error) first; or the launcher was interrupted (SIGINT, SIGTERM, SIGHUP), which it passed on.
typedef enum { LAUNCH_OK = 0, LAUNCH_RANK_FAILED, LAUNCH_SIGNALLED } LaunchCause;
typedef struct {
    LaunchCause cause;
    int rank;   // the rank that failed first (LAUNCH_RANK_FAILED)
    int signal; // the signal that killed that rank, or that interrupted the launcher; 0 otherwise
    int status; // the exit status to exit with: 0, the rank's status (128 + signal when killed), or 128 + signal
} LaunchResult;

// `--nproc N`: forks N local ranks running this binary with argv minus "--nproc N", each with the
// torchrun-style environment and a fresh job token, and waits for them. SIGUSR1 is passed on (the
// ranks start with it blocked and unblock it once their handler is in place); SIGINT, SIGTERM and
// SIGHUP are passed on as SIGTERM, and ranks still running LLM4D_KILL_GRACE seconds later (default
// 30) are killed. When a rank fails, one line names the rank that stopped answering, and the others
// get SIGTERM (SIGCONT first when stopped) and min(5, LLM4D_KILL_GRACE) seconds before SIGKILL.
// Keeps no state between calls (a restart loop may call it again). Returns result->status; result
// may be NULL.
int launch_local(int nproc, int argc, char **argv, LaunchResult *result);

#endif
