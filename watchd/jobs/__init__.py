"""Job awareness: which nodes and GPUs each job runs on, from the schedulers and from the agents."""

from watchd.jobs.model import JobInfo, JobProvider, JobProviderError

__all__ = ["JobInfo", "JobProvider", "JobProviderError"]
