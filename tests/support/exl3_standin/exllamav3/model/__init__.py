from exllamav3.model.config import Config
from exllamav3.model.model import Model

__all__ = ["Config", "Model"]
