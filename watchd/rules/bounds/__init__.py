"""The bounds of a template render (docs/rules.md, *Templates*): the size of what a template builds, the work
one render may do, and what is refused at load because it can only break them.

The sandbox keeps templates away from the engine's internals; these bounds keep them from its memory and its
event loop. Every operation that can build a large value from a small one (``*``, ``**``, ``+``, ``%``,
``~``, the size-taking string methods, filters, ``str.format``) is intercepted and checked *before* it
builds; every loop iteration, call, filter, operator and piece of output is a step of a per-render budget,
with a CPU-time deadline behind it. A template over a bound renders ``<template error: ...>`` for that
action, as any other template error.

budget: the bounds themselves and the per-render budget of steps and CPU time; sizes: how large a value is
or would print; operations: the operators, ``%``/``str.format`` and method calls checked before they build;
filters: Jinja's filters wrapped; instrument: the rewrite that sends every loop, ``~`` and piece of output
through a step; static_check: what is refused at load. ``watchd.rules.template`` applies them.
"""
