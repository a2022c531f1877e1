def test_group_bound_by_count_and_by_bytes_of_keys() -> None:
    """Issue 16 item 8: long keys are bounded by their bytes, not only by their number."""
    from watchd.rules.rule_state import GroupBound, key_bytes

    bound = GroupBound(max_groups=3, max_bytes=10_000)
    table: dict[tuple[object, ...], int] = {}
    for i in range(5):
        table[(f"n{i}",)] = i
        bound.added(table, (f"n{i}",))
    assert list(table) == [("n2",), ("n3",), ("n4",)] and bound.evicted == 2  # by count, oldest first
    big = GroupBound(max_groups=100_000, max_bytes=3 * key_bytes(("x" * 2000,)))
    wide: dict[tuple[object, ...], int] = {}
    for i in range(10):
        key = (f"{i}" + "x" * 1999,)
        wide[key] = i
        big.added(wide, key)
    assert len(wide) == 3 and big.evicted == 7 and list(wide.values()) == [7, 8, 9]
    lone = GroupBound(max_groups=10, max_bytes=100)
    alone: dict[tuple[object, ...], int] = {("y" * 500,): 1}
    lone.added(alone, ("y" * 500,))
    assert len(alone) == 1  # the group just inserted is kept, even over the bound
    for k in list(wide):  # deleted elsewhere (a rule fired): the estimate is corrected when it matters
        del wide[k]
    for i in range(3):
        key = (f"{i}" + "z" * 1999,)
        wide[key] = i
        big.added(wide, key)
    assert len(wide) == 3 and big.evicted == 7
