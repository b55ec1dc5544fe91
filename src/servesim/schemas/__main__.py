"""``python -m servesim.schemas``: regenerate the committed JSON Schemas."""

from servesim.schemas import write_all

for path in write_all():
    print(f"wrote {path.name}")
