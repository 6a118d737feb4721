"""The shared learning-rate schedule and its time-budget variant."""

from ssr_lab.train.schedule import budget_step, cosine_lr


def test_budget_step_follows_the_steps_while_the_run_is_on_time() -> None:
    # 100 steps in 10 minutes: at step 40 after 3 minutes the run is ahead of its budget
    assert budget_step(40, 100, 3.0, 10.0) == 40


def test_budget_step_advances_with_the_budget_spent_when_the_run_is_slow() -> None:
    # a slow machine: step 40 after 6 of 10 minutes is scheduled as step 60
    assert budget_step(40, 100, 6.0, 10.0) == 60
    assert budget_step(40, 100, 12.0, 10.0) == 100  # never past the last step


def test_a_run_cut_by_its_budget_ends_at_the_schedule_floor() -> None:
    steps, floor = 100, 0.1
    # the budget runs out at step 55: its last learning rate is the floor, not mid-decay
    cut = cosine_lr(budget_step(55, steps, 10.0, 10.0), 1.0, 10, steps, floor)
    plain = cosine_lr(55, 1.0, 10, steps, floor)
    assert abs(cut - floor) < 1e-9 < plain - floor


def test_no_budget_leaves_the_step_alone() -> None:
    assert budget_step(7, 100, 5.0, 0.0) == 7
