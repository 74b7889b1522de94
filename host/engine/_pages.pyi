"""Stub of the compiled module host/engine/_pages.c (a rewind's page copy and a capture's page
compare in C)."""

def copy_back(dst: int, src: int, pagemap: bytes, mask: bytes, page: int, /) -> int: ...
def drop_same(
    base: int, reference: int, mask: bytearray, page: int, image_pages: int, /
) -> int: ...
def drop_same_at(
    base: int, reference: int, mask: bytearray, page: int, image_pages: int, pieces: bytes, /
) -> int: ...
