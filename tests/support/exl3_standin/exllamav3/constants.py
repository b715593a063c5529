PAGE_SIZE = 256  # exllamav3/constants.py
