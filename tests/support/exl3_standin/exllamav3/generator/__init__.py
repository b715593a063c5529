from exllamav3.generator.generator import Generator
from exllamav3.generator.job import Job

__all__ = ["Generator", "Job"]
