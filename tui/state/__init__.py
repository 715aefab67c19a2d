"""Pure domain code: the model, the reducer, the view model, the log's two families
(``logpage``: paging a remote log; ``loganalysis``: analysing its lines, with
``logbytes`` turning raw bytes into lines for both), patch sets, advice and watch rules.
No I/O on the network, no Textual, no Rich."""
