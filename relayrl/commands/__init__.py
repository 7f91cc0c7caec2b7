"""The `relayrl` subcommands, one module each: its parser (`register(commands)`) and what it runs (`run(args)`).

relayrl/cli.py is the dispatcher: it registers every module in `COMMANDS`, parses, and turns a user mistake or a
stop into one line and an exit status. A command module imports only the standard library at module level, so
building the parser (and `--help`) stays fast; the work it runs is imported when it runs.
"""

from relayrl.commands import bench, config, data, demo, eval, export, plan, report, reward, serve, sft, train

COMMANDS = (train, eval, reward, sft, demo, plan, bench, config, data, export, report, serve)  # the order of --help
