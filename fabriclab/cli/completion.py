"""``fabriclab completion bash|zsh``: shell completion made from the command's own parser, so it
never falls behind a command or an option: command names, each command's options, the
choices of an option that has them, and file names where a command takes files."""

from __future__ import annotations

import argparse

from rich.console import Console

from fabriclab.cli.output import EXIT_OK
from fabriclab.cli.requests import CompletionRequest

BASH = r"""# fabriclab completion for bash: source it (or put it in bash-completion's folder)
_fabriclab() {
  local cur prev cmd i
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD-1]}"
  cmd=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      -*) ;;
      *) if [[ " %(commands)s " == *" ${COMP_WORDS[i]} "* ]]; then cmd="${COMP_WORDS[i]}"; break; fi ;;
    esac
  done
  case "$cmd:$prev" in
%(choices)s
  esac
  if [[ -z "$cmd" ]]; then
    COMPREPLY=($(compgen -W "%(commands)s %(globals)s" -- "$cur"))
    return
  fi
  case "$cmd" in
%(options)s
  esac
}
complete -o default -F _fabriclab fabriclab
"""

ZSH = """# fabriclab completion for zsh: source it (bash's completion, through bashcompinit)
autoload -U +X compinit && compinit
autoload -U +X bashcompinit && bashcompinit
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its sub-parsers in this action only
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion of ``parser`` (the ``fabriclab`` parser)."""
    commands = _subparsers(parser)
    choices, options = [], []
    for name, sub in sorted(commands.items()):
        for action in sub._actions:
            if action.choices and action.option_strings:
                for opt in action.option_strings:
                    choices.append(f'    {name}:{opt}) COMPREPLY=($(compgen -W '
                                   f'"{" ".join(map(str, action.choices))}" -- "$cur")); return ;;')
            elif action.choices and not action.option_strings:
                options.append(f'    {name}) COMPREPLY=($(compgen -W '
                               f'"{" ".join(map(str, action.choices))}" -- "$cur")); return ;;')
                break
        else:
            options.append(f'    {name}) if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W '
                           f'"{" ".join(_options(sub))}" -- "$cur")); fi ;;')
    return BASH % {"commands": " ".join(sorted(commands)), "globals": " ".join(_options(parser)),
                   "choices": "\n".join(choices) or "    *) ;;",
                   "options": "\n".join(options)}


def completion(req: CompletionRequest, ui: Console) -> int:
    from fabriclab.cli.main import build_parser

    script = bash_script(build_parser())
    print(script if req.shell == "bash" else ZSH + script, end="")
    return EXIT_OK
