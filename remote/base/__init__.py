"""What every host part reads: output lines and errors (`wire`), the atomic write
(`atomicfile`), the trust rule for what the host opens (`trust`), /proc (`procfs`), GPU
readings (`gpus`). Imports no other room of `remote`."""
