"""The `prfaas` entry point: one click group, subcommands imported lazily.

Each subcommand lives in its own module `prfaas.cli.<name>` exposing `command` (a
`click.Command`). Lazy loading keeps `prfaas plan` from importing torch. Every `PrfaasError`
becomes one line on stderr and exit code 2 (no traceback).
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
import threading
from types import FrameType

import click

from prfaas.core.errors import PrfaasError

# name -> (module, one-line help shown in `prfaas --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("prfaas.cli.plan", "Throughput model and optimiser: t, N_p:N_d, capacity, egress."),
    "kv": ("prfaas.cli.kv", "KVCache size of a model at given lengths."),
    "bandwidth": ("prfaas.cli.bandwidth", "Egress projection of a prefill cluster (Eq. 2)."),
    "simulate": ("prfaas.cli.simulate", "Discrete-event simulation of a system under load."),
    "capacity": ("prfaas.cli.capacity", "Highest sustainable rate of a system, by simulation."),
    "reproduce": ("prfaas.cli.reproduce", "Reproduce the paper's case study end to end."),
    "generate": ("prfaas.cli.generate", "Run the small hybrid model in one process."),
    "profile": ("prfaas.cli.profile", "Measure an engine's prefill/KV/decode profile."),
    "sim-vs-live": ("prfaas.cli.sim_vs_live",
                    "A deployment against the simulator built from its measured profile."),
    "serve": ("prfaas.cli.serve", "Start the router and workers of a topology."),
    "vllm-model": ("prfaas.integrations.vllm.cli", "Build a tiny HF model for vLLM (no download)."),
    "bench": ("prfaas.cli.bench", "Replay requests against a running router."),
    "certs": ("prfaas.cli.certs", "Certificates for a topology's mutual-TLS links."),
    "tokenizer": ("prfaas.cli.tokenizer",
                  "The served model's tokenizer folder, for benchmark clients."),
}


def _available(name: str) -> bool:
    return importlib.util.find_spec(COMMANDS[name][0]) is not None


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS or not _available(cmd_name):
            return None
        module = importlib.import_module(COMMANDS[cmd_name][0])
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="prfaas")
def cli() -> None:
    """prfaas: Prefill-as-a-Service for hybrid-attention LLMs: plan, simulate, serve."""


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; project errors become one line on stderr and exit code 2. SIGTERM ends a
    command as Ctrl-C does, through its `finally`s and `with`s (the engine instances a
    profile or a sim-vs-live run started are stopped), exit code 143; a command with its own
    handler (`serve`) installs it over this one."""
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _main(argv)
    finally:
        if previous is not None:  # (None: set outside Python, nothing to put back)
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="prfaas", standalone_mode=False)
    except PrfaasError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except UnicodeDecodeError:
        # a safety net: readers map this to a ConfigError naming the file
        click.echo("error: an input file is not text (not valid UTF-8)", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(2 if err.exit_code == 2 else err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
