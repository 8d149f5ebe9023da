"""Options that several commands take together, declared once: a group is a function whose
parameters are the options (typer's `Annotated` form) and whose result is what a command gets
for them, in one parameter. `grouped(limits=listener)` on a command puts `listener`'s options
in place of its `limits` parameter, for typer, its help and `--config` alike, and calls it
with `listener(...)`'s result. A group may itself be made of groups. The parameter a group
fills is best keyword-only (after `*`): it has no default of its own to come after others."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    return list(inspect.signature(function, eval_str=True).parameters.values())


def grouped(**groups: Callable[..., Any]) -> Callable[[F], F]:
    """The command with each parameter named here given by its group's options."""

    def decorate(command: F) -> F:
        own = inspect.signature(command, eval_str=True)
        names = {name: [p.name for p in _parameters(group)] for name, group in groups.items()}
        parameters: list[inspect.Parameter] = []
        for parameter in own.parameters.values():
            group = groups.get(parameter.name)
            if group is None:
                parameters.append(parameter)
            else:  # in its place, of its kind (keyword-only after a `*`)
                parameters += [p.replace(kind=parameter.kind) for p in _parameters(group)]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            for name, group in groups.items():
                kwargs[name] = group(**{key: kwargs.pop(key) for key in names[name]})
            return command(*args, **kwargs)

        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        run.__annotations__["return"] = own.return_annotation
        return run  # type: ignore[return-value]

    return decorate
