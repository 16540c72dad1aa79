"""`llmtui`: the command line, one module per command group. Subcommands call tuiapp.core; the
bare command opens the TUI (tuiapp.ui.launch).

    __main__   the `llmtui` console script: the bare command opens the TUI without importing the rest
    main       the parser, assembled from each group's adders, and `main`
    recipe     validate, estimate, schema, data: a recipe before any run
    run        run, stop, resume, doctor: launching and following a run
    runs       runs, show: what the runs folder holds
    manage     queue, sweep, tag, note, rename, archive, delete, trash
    export     export: a run's model to a folder, GGUF, the Hub
    after      chat, eval, export-metrics
    probe      probe: micro-batch sizes tried for real
    cache      cache list | prune: the tokenized datasets
    model      model: what a base model is, and each method's verdict on it
    serve_ui   serve-ui: the TUI in a browser
    serve      serve: a run's model behind an OpenAI-compatible endpoint
    scale      the scale-out flags (node mode, SLURM) of run and resume, and show's node lines
    shared     error lines and torch-side tools in a child process, for several groups

Nothing here imports torch, transformers, deepspeed or textual: the TUI is imported lazily, and
commands that need torch run it in a child process. This file stays free of imports, so that
`python -m tuiapp.cli` (the bare TUI) loads no subcommand.
"""
