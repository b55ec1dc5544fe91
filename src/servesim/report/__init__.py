"""``servesim report``: a self-contained HTML page of sweep or search results, or of one
replay (``servesim[report]``, plotly)."""
