from exllamav3.tokenizer.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
