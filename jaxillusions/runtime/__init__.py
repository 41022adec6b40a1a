"""How the work runs: devices, the machine, signals, timing, checkpoints, caches, batches,
the stages' files and context, the one TensorBoard writer, the results row's schema."""
