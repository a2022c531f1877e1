"""The generated fast path of rule evaluation: matches, the rule index, each rule's steps and actions as
Python generated once at load (codegen.py says why that is safe). It is an optimisation of
watchd/rules/specification.py and nothing more: tests/rules/test_compiled_contract.py checks that it decides
exactly as the specification does, and a change of semantics starts there."""
