"""The `stillhere` command line: one module per command, `main` to dispatch them.

Commands sit above everything else: they start servers (`transport`), open stores
(`storage`) and run the benches and evaluations; nothing below imports them."""
