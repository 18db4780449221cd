"""How `--help` shows flags: words for values (FILE, COL, N) instead of typer's `<str>`/`<bool>`, no
per-flag env-var line (one note says the rule), so each command's help fits a screen."""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

ENV_NOTE = "Every flag can also be set as EMBEDCLI_<FLAG> (e.g. EMBEDCLI_MODEL, EMBEDCLI_OUTPUT, EMBEDCLI_LOG_EVERY)."

FILE_FLAGS = {"output", "stats", "errors-file", "calibration", "previous", "queries", "shards-dir"}
SECONDS_FLAGS = {"log-every", "commit-every"}


def metavar(param: Any) -> str:
    """The word shown for a flag's value: FILE, COL(S), N, SECONDS, K/N, TEXT; empty for on/off flags."""
    name = max(getattr(param, "opts", []) or [""], key=len).lstrip("-")
    kind = param.type_descriptor.annotation
    if getattr(param, "is_flag", False) or kind is bool:
        return ""
    if name in FILE_FLAGS:
        return "FILE"
    if name in SECONDS_FLAGS:
        return "SECONDS"
    if name == "shard":
        return "K/N"
    if name.endswith("-cols"):
        return "COLS"
    if name.endswith("-col"):
        return "COL"
    if name == "model":
        return "MODEL"
    return {int: "N", float: "X"}.get(kind, "TEXT")


def plain_help(command: Any) -> Any:
    """Set value words and drop the env-var lines of `command`'s options (choices keep their list)."""
    for param in command.params:
        # typer ships its own click: tell options from arguments by their type name.
        if param.param_type_name == "option":
            param.show_envvar = False
            if param.metavar is None and not param.type_descriptor.is_choice:
                param.metavar = metavar(param)
        elif param.param_type_name == "argument":
            # typer shows an argument's annotation (`<list[str]>`) whatever its metavar: name the values instead.
            word = "FILE..." if param.nargs != 1 else "FILE"
            param.display_type_rich = lambda ctx, word=word: word
    get_help_option = command.get_help_option

    def help_option(ctx: Any) -> Any:
        option = get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # an on/off flag: no value word (typer would show <bool>)
        return option

    command.get_help_option = help_option
    if command.help and ENV_NOTE not in command.help and not hasattr(command, "commands"):
        command.help = f"{command.help}\n\n{ENV_NOTE}"
    return command


class PlainHelpGroup(TyperGroup):
    """The app's group: each command's help is made plain (`plain_help`) when it is looked up."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The group's own options (typer adds the completion ones late), with plain help."""
        params = super().get_params(ctx)
        for param in params:
            if param.param_type_name == "option" and param.metavar is None:
                param.metavar = metavar(param)
        return params

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command `cmd_name`, with plain help."""
        command = super().get_command(ctx, cmd_name)
        return plain_help(command) if command is not None else None
