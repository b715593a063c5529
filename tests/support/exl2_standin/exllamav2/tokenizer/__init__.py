from exllamav2.tokenizer.tokenizer import ExLlamaV2Tokenizer

__all__ = ["ExLlamaV2Tokenizer"]
