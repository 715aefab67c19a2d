"""Pure domain code: the model, the reducer, the view model, the log parsers and signatures,
patch sets, advice and watch rules. No I/O on the network, no Textual, no Rich."""
