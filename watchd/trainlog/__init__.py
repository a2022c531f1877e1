"""What the training stack says about a hang: PyTorch watchdog and NCCL lines, NCCL RAS reports and
Flight Recorder dumps, parsed into the kinds of :mod:`watchd.model.trainlog`. Pure."""
