"""Training profiles: the book's named profiles (``PROFILES``), and a name resolved to one.

``PROFILES`` names the ones the book uses: ``study`` is the trained-model study's (five seeds,
a budget that follows progress), ``cpu`` the recipe study's fixed-budget profile, ``paper`` the
base 10.6 M model with a budget meant for one GPU, ``paper_study`` the base model under the
``study`` profile's budget rules; each states why its numbers were chosen. What a profile holds
is ``nopelib.training.train_profile``'s ``TrainProfile``. Nothing else in the package branches
on a profile's name.
"""

from __future__ import annotations


from nopelib.core.model import GPTConfig
from nopelib.core.tasks import TASKS
from nopelib.training.train_profile import BATCHED_SUFFIX, TrainProfile


PROFILES: dict[str, TrainProfile] = {
    # The recipe study's profile (book/results/recipe_*.json; the trained chapter reads the
    # study profile below), in the paper's regime on a 2-core CPU: a 4-layer, 96-wide NoPE model
    # (0.45 M parameters) whose initialisation shows the adjacency pattern (the token
    # embedding's std is 0.002, so the averaging theory's ratio rho is small; see the trained
    # chapter), 3 seeds (the fewest for which a t interval over seeds can decide), evaluated
    # on the whole test split.
    # Only reversal is in the claim set (claim_tasks), at 4,000 steps in batches of 32 at lr
    # 1e-3. At lr 2e-3 its runs collapsed mid-training on an AVX-512 CPU (seed 1 fell from 0.82
    # to 0.0 exact match at step 1,800 and was back above 0.9 only at step 3,400, too late in
    # the budget for the claim rule, nopelib.rules.claims.past_plateau); at 1e-3 seeds 0 and 1
    # stayed at 0.9 or above from steps 1,800 and 1,700, so 4,000 steps leave more than half the
    # budget past the plateau. Addition at 7,000 steps in batches of 64 ended while its runs were
    # still leaving their plateau: 0.925 / 0.945 on an AVX2 CPU, 0.903 / 0.704 under AVX-512
    # kernels; the budget that learns it with margin (28,000 steps in the recipe study) does not fit
    # a chapter, so addition, like indexing and ordering, gets 500 steps: enough to show its
    # plateau, and no claim.
    "cpu": TrainProfile(
        name="cpu",
        model=GPTConfig(n_layer=4, n_head=4, n_embd=96, init_std=0.002),
        steps=500,
        task_budgets=(("reversal", 4000, 32, 1e-3),),
        claim_tasks=("reversal",),
        batch_size=32,
        lr=2e-3,
        min_lr_ratio=0.1,
        warmup_steps=200,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=20_000,
        eval_batch_size=500,  # pads less than 1,000: 2-16 % faster by task (reversal most)
        log_every=50,
        seeds=(0, 1, 2),
        curve_every=100,
        n_curve=500,
    ),
    # The trained-model study's profile (nopelib.studies.trained_study, committed as
    # book/results/trained_study_<task>.json): the cpu profile's model, 5 seeds (the paper's
    # count), every task in the claim set, and a budget that follows progress: lr 1e-3 held
    # until 1,000 validation examples are at 0.97 exact match, then a linear decay over as
    # many steps again (half of every run lies past the point where it was learned), capped
    # at 60,000 steps. Measured before it was chosen (seed 0, batch 64, lr held, curve on 500
    # test examples every 500 steps): at lr 1e-3 ordering left its plateau near step 5,500
    # and was at 0.978 by 7,500; indexing left its plateau near 7,000 and climbed slowly
    # (0.636 at 14,000); at lr 5e-4 indexing was still on its plateau at 6,000. The first
    # study (commit 04f00e3) decayed over half as many steps again, capped at 30,000: one run
    # per task then fell short of the claim rule's margin (reversal seed 2's test curve dipped
    # below 0.9 after its validation split was at the level; ordering seed 2 hit the cap), so
    # the tail is now the whole run so far and the cap twice what that seed needed. A rerun
    # of reversal with that tail (commit c65fc01) still left seed 4 short (tail 0.20: its
    # validation and test curves fell to 0.87 during the tail and came back), so a run that
    # loses its task in the tail (validation below 0.9, the learnedness line) now trains a
    # whole tail again once validation is back at the level (relearn_below).
    "study": TrainProfile(
        name="study",
        model=GPTConfig(n_layer=4, n_head=4, n_embd=96, init_std=0.002),
        steps=60_000,
        batch_size=64,
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=200,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=20_000,
        eval_batch_size=500,
        log_every=50,
        seeds=(0, 1, 2, 3, 4),
        claim_tasks=tuple(TASKS),
        curve_every=250,
        n_curve=1_000,
        stop_at=0.97,
        tail_share=1.0,
        relearn_below=0.9,
        n_val=1_000,
        n_trajectory=128,
    ),
    # The paper's base model (6 layers x 384 wide x 6 heads, 10.6 M parameters), 5 seeds, the
    # whole test split; a budget meant for one GPU (5,000 steps of 256: 64 epochs of the 20,000
    # training examples).
    "paper": TrainProfile(
        name="paper",
        model=GPTConfig(),
        steps=5000,
        batch_size=256,
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=250,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=20_000,
        eval_batch_size=2_000,
        log_every=100,
        seeds=(0, 1, 2, 3, 4),
        claim_tasks=tuple(TASKS),
    ),
    # The trained-model study of the paper's model (nopelib.studies.trained_study --profile
    # paper_study). The model is the paper's base model unchanged (GPTConfig(): 6 layers x 384
    # wide x 6 heads, nanoGPT's init: std 0.02, residual projections 0.02 / sqrt(2 x 6), no
    # position encoding). The budget is the study profile's, rule for rule (batch 64 at lr 1e-3
    # held until 1,000 validation examples are at 0.97, a tail as long as the run so far,
    # restarted when validation falls below 0.9 in it, capped at 60,000 steps; 5 seeds, every
    # task judged), so that the two models are judged alike. 64 trajectory inputs: the issue
    # asks for at least 64, and 128 costs twice the scoring time on this model. Curve points
    # every 25 steps up to step 1,000, every 250 after, because the pattern of this model moves
    # early: on addition its layer-1 score fell from 0.732 to 0.456 within the first 250 steps
    # (measured by a referee with the project's train). bf16 autocast on a CPU with bf16 units
    # (float32 elsewhere, with a warning; the run key records which): a step took 0.72 s
    # against 1.28 s in float32 on one thread of the AVX-512/AMX development VM (reversal,
    # batch 64), and the check fixed before it ran (nopelib.studies.precision,
    # book/results/precision_paper_study_reversal.json: reversal, seeds 0-2, the first 250
    # steps in both precisions) found the bf16 run of each seed no farther from its float32
    # run than two float32 seeds are from each other, for every layer's score and validation
    # exact match: "no change".
    "paper_study": TrainProfile(
        name="paper_study",
        model=GPTConfig(),
        steps=60_000,
        batch_size=64,
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=200,
        weight_decay=0.1,
        betas=(0.9, 0.98),
        grad_clip=1.0,
        n_train=20_000,
        n_test=20_000,
        n_eval=20_000,
        eval_batch_size=500,
        log_every=50,
        seeds=(0, 1, 2, 3, 4),
        claim_tasks=tuple(TASKS),
        curve_every=250,
        curve_dense_every=25,
        curve_dense_until=1_000,
        n_curve=1_000,
        stop_at=0.97,
        tail_share=1.0,
        relearn_below=0.9,
        n_val=1_000,
        n_trajectory=64,
        precision="bfloat16",
    ),
}


def get_profile(profile: str | TrainProfile) -> TrainProfile:
    """The profile called ``profile`` (a TrainProfile passes through, e.g. a test's tiny one);
    ``<name>+batched`` is the ``batched()`` twin of a known profile, as its runs record it."""
    if isinstance(profile, TrainProfile):
        return profile
    base = profile.removesuffix(BATCHED_SUFFIX) if isinstance(profile, str) else profile
    if base not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; allowed: {sorted(PROFILES)}, "
                         f"each also as its batched twin '<name>{BATCHED_SUFFIX}'")
    return PROFILES[base] if base == profile else PROFILES[base].batched()


