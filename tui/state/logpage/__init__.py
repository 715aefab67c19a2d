"""Paging a remote log: the log viewer's document, read from the host on demand.

``blocks`` holds the bytes (an LRU of aligned blocks fetched through ``read_range``, a
sparse line index, one physical line cleaned as the pane shows it); ``document`` is the
``LogDocument`` over them (lines by number, search, filter, the root cause's place).
Nothing here holds the whole file. Pure: no Textual.
"""
