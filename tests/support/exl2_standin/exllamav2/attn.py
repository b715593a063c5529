"""Stand-in for exllamav2.attn: flash-attn detection flags and the paged-attention check."""

has_flash_attn = False
has_flash_attn_with_paged = False  # tests flip this to exercise paged mode
has_flash_attn_with_window = False
has_flash_attn_with_softcap = False
has_xformers = False


def assert_paged_attn():
    global has_flash_attn_with_paged
    assert has_flash_attn_with_paged, "Paged attention required Flash Attention 2.5.7 or later"
