// SIGTERM and SIGUSR1 (Slurm's warning before a time limit or preemption) request a
// stop: the handler only sets a flag; the training loop reads it at a step boundary,
// the ranks agree (any rank's request stops all), save a checkpoint and exit with 3.
#pragma once

namespace trident {

// Installs the handlers (idempotent). Not thread-safe; call once from main().
void install_stop_signal_handlers();
// True once SIGTERM or SIGUSR1 arrived (async-signal-safe flag).
bool stop_requested();
// For tests: request a stop as if a signal had arrived.
void request_stop();

}  // namespace trident
