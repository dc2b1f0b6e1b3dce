// Stop signals of `trident train`: SIGTERM, SIGINT (Ctrl-C), SIGHUP (the terminal closed,
// the ssh session dropped) and SIGUSR1 (Slurm's warning before a time limit or
// preemption). The handler knows two phases:
//
// - Start-up (from install_stop_signal_handlers() until set_stop_mode_graceful(): MPI
//   init, config load, data open/scan, model init, checkpoint load): the first stop
//   signal ends the process at once with exit code 3 and the message
//     trident: SIGTERM during start-up: exiting now (nothing trained yet; the newest
//     checkpoint is unchanged)
//   Nothing needs saving, and a process blocked in start-up (a FIFO, a hung network
//   filesystem) can still be stopped; 3 makes scripts/slurm/train.sbatch requeue, and the
//   requeued job resumes from the unchanged newest checkpoint.
// - Training (after set_stop_mode_graceful(), which Trainer::run calls before its loop):
//   the first stop signal only sets a flag; the loop reads it at the next step boundary,
//   the ranks agree (any rank's request stops all), save a checkpoint and exit with 3.
//   A second stop signal while that stop is pending (the step, the evaluation or the
//   save has not finished), at least 0.5 s after the first — closer ones are copies of
//   the same request (Ctrl-C reaches mpirun and every rank, and mpirun forwards it; a
//   plain scancel signals the tasks while train.sbatch forwards SIGUSR1) — ends the
//   process at once with exit code 128 + signo (143 for
//   SIGTERM, 130 for SIGINT, 129 for SIGHUP, 138 for SIGUSR1) and the message
//     trident: second SIGTERM while a stop was pending: exiting now without saving (the
//     newest committed checkpoint is unchanged)
//   Checkpoints are committed by atomic renames, so the newest committed one stays valid.
//
// The handler is async-signal-safe: it touches lock-free atomics, write(2)s a fixed
// message to stderr and calls _exit (no destructors, no atexit, no MPI_Finalize). Signals
// may be handled on any thread. SA_RESTART: interrupted calls resume.
#pragma once

namespace trident {

// Installs the handlers in start-up mode (idempotent). Call first thing in a command.
// An inherited "ignore SIGINT" (a background job of a shell) or "ignore SIGHUP" (nohup) is
// kept.
void install_stop_signal_handlers();
// Switches to training mode: from now on the first stop signal is a graceful request.
void set_stop_mode_graceful();
// True once a stop signal arrived in training mode (or request_stop() was called).
bool stop_requested();
// For tests: request a stop as if a signal had arrived in training mode.
void request_stop();

}  // namespace trident
