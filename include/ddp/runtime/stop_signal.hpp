// SIGTERM/SIGINT as a request to stop at the next step boundary (Slurm
// preemption, scancel, Ctrl-C). The handler only records the signal; the
// trainer asks every rank at each step boundary, so all agree on where to stop.
#pragma once

namespace ddp {

// Installs the handlers (idempotent).
void install_stop_handlers();
// The signal number received, or 0.
int stop_signal();

}  // namespace ddp
