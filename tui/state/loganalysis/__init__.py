"""Analysing a log's lines, one at a time, as a pure fold.

``fold.step(analysis, line, line_no, t)`` folds one line into a ``record.LogAnalysis``;
the line-level parsers it calls are ``lineshapes`` (prefixes, shard bars, extractor
progress), ``train`` and ``trainphases`` (training progress and phases), ``failures``
(tracebacks, exception lines, chains, request errors) and ``signatures`` (the failure
signature table). The raw bytes become lines in ``tui.state.logbytes`` first. Pure: no
I/O beyond reading signature files, no Textual.
"""
