"""A person's correction round inside a finished run (HG-DAgger with a human expert).

HG-DAgger (M. Kelly, C. Sidrane, K. Driggs-Campbell, M. J. Kochenderfer, "HG-DAgger: Interactive Imitation
Learning with Human Experts", ICRA 2019): a person watches the student and takes over when it goes wrong;
only the person's steps are labelled and added to the data. ``ratchet correct RUN`` plays the episodes
(:mod:`ratchet.correct`); this module puts the round into the run's ledger and ends it the way every
candidate ends, at the run's gate:

0. :meth:`CorrectionRound.record_episode` — while the person plays, each episode as it ends:
   ``correction_episode`` (key ``correction/N/episode/I``) with the episode's record and its person steps (an
   artifact), so a process killed mid-session (``kill -9``) keeps the finished episodes:
   :meth:`CorrectionRound.record_pending` (``ratchet correct RUN --resume-round``) makes them the round.
1. :meth:`CorrectionRound.record` — the person's data set as an artifact, then ``correction_recorded``
   (key ``correction/N/recorded``): who (``"person"``), the candidate played, seeds, per episode length,
   return, terminated, truncated, takeover segments ``[start, end, who]`` (end exclusive) and person steps,
   and the data set's digest.
2. :meth:`CorrectionRound.finish` — a sandboxed training job (trainer ``"dagger"``, mode ``"person"``: it
   collects nothing and clones the aggregate — the played candidate's ``dataset`` artifact, if any, plus the
   person's steps — from the played candidate's weights), recorded as ``training_finished``; the student is
   proposed (``candidate_proposed``), validated on the run's validation seeds and decided by the run's gate
   as the run's next decision (same gate settings; alpha spending counts it) — ``gate_decided`` and, when
   it promotes, ``incumbent_changed``; then the (possibly new) incumbent's test evaluation and
   ``correction_finished`` (key ``correction/N/finished``) with the verdict and the test summary.

The events of step 2 carry ``"correction_round": N``; the projection (:func:`ratchet.ledger.projection.project`)
counts their env steps apart from the run's budget (as do the person's env steps: a round is outside the run's
refinement budget), moves the incumbent on ``incumbent_changed`` and takes the round's test evaluation as the
run's. Every step is keyed, artifacts are stored before the events naming them, and :meth:`finish` reads back
what was recorded, so a round killed at any point is finished by calling :meth:`finish` again (``ratchet
correct RUN --resume-round``) without asking the person again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, Self

from ratchet.critic import Evaluation
from ratchet.errors import RatchetError
from ratchet.ledger import EventType
from ratchet.ledger.lease import WriterLease
from ratchet.ledger.projection import RunState, project
from ratchet.ledger.rounds import correction_rounds, unfinished_round
from ratchet.policy import Candidate

__all__ = ["PERSON_SEEDS_START", "CorrectionRound", "unfinished_round"]

#: Person rounds draw their episode seeds from the training split from this index on (far above the loop's
#: per-generation seeds and its training jobs' range), each round after the seeds the earlier rounds played.
PERSON_SEEDS_START = 2_000_000_000

_EPISODE_KEYS = ("seed", "length", "return", "terminated", "truncated", "segments", "person_steps")


def _checked(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Episode records as dicts, checked (keys present, segments covering the episode).

    Raises:
        RatchetError: a malformed record.
    """
    out = [dict(r) for r in records]
    for r in out:
        missing = [k for k in _EPISODE_KEYS if k not in r]
        segs = r.get("segments") or []
        if missing or not segs or segs[0][0] != 0 or segs[-1][1] != r["length"] or \
                any(a[1] != b[0] for a, b in pairwise(segs)):
            raise RatchetError(f"episode record of seed {r.get('seed')} is malformed (keys {sorted(r)}; segments "
                               "must cover the episode)")
    return out


class CorrectionRound:
    """A finished run held open for a person's correction round: its directory lock and writer lease are taken
    here (as ``ratchet resume`` takes them) and kept until :meth:`close`.

    Args:
        run: Run id or run directory.
        runs_dir: Folder that holds run directories.
        storage: Database URL to look the run up in (see :func:`ratchet.loop.open_run`).
        executor: Runs the round's training job and episodes; default a process pool per the run's
            ``[execution]``, started on first use and closed by :meth:`close`.

    Raises:
        RunNotFoundError: no such run.
        LedgerError: another process on this machine writes the run, or the run has not finished.
        WriterLeaseError: another live process writes the run.
    """

    def __init__(self, run: str | Path, runs_dir: str | Path = "runs", *, storage: str | None = None,
                 executor: Any = None) -> None:
        from ratchet.errors import LedgerError
        from ratchet.runs import open_for_writing

        self._storage, self._executor = storage, executor
        self._own_executor = executor is None
        self._run: Any = None
        self.ledger, self.run_dir, self._lock_fd, lease = open_for_writing(run, runs_dir, storage=storage)
        self._lease: WriterLease | None = lease  # None once released
        try:
            self.state: RunState = project(self.ledger.read())
            if self.ledger.get("run_finished") is None:
                raise LedgerError(f"run {self.state.run_id} has not finished; a correction round follows a finished "
                                  f"run: `ratchet resume {run}` first")
        except BaseException:
            self.close()
            raise

    # -- what the round needs to know ------------------------------------------------------------
    def refresh(self) -> RunState:
        """Re-read the ledger (this process is its only writer) and return the state."""
        self.state = project(self.ledger.read())
        return self.state

    @property
    def next_round(self) -> int:
        """The number the next recorded round gets (1-based)."""
        return max(correction_rounds(self.ledger.read()), default=0) + 1

    def unfinished(self) -> int | None:
        """See :func:`unfinished_round`."""
        return unfinished_round(self.ledger.read())

    def pending_episodes(self) -> list[dict[str, Any]]:
        """The ``correction_episode`` payloads of the next round (played, the round not recorded yet: a session
        that was killed), in order."""
        events = self.ledger.read()
        n = max(correction_rounds(events), default=0) + 1
        return [dict(e.payload) for e in events
                if e.type is EventType.CORRECTION_EPISODE and int(e.payload["round"]) == n]

    def record_episode(self, candidate: Candidate, record: Mapping[str, Any], dataset: Any) -> int:
        """Append one finished episode of the round being played (``correction_episode``), so that it survives a
        killed process; :meth:`record` still records the round when the session ends.

        Args:
            candidate: The candidate played.
            record: The episode's record (see :meth:`record`).
            dataset: The person's steps of that episode.

        Returns:
            The episode's index in the round.

        Raises:
            RatchetError: a malformed record, one that does not match the data set, or another candidate than
                the round's earlier episodes.
        """
        r = _checked([record])[0]
        if int(r["person_steps"]) != len(dataset):
            raise RatchetError(f"the data set holds {len(dataset)} steps, the episode {r['person_steps']} person steps")
        done = self.pending_episodes()
        if done and done[0]["candidate_id"] != candidate.id:
            raise RatchetError(f"the round's earlier episodes played {done[0]['candidate_id']}, not {candidate.id}")
        n, i = self.next_round, len(done)
        digest = self.ledger.put_artifact(dataset.to_bytes())  # before the event that names it
        self.ledger.append(EventType.CORRECTION_EPISODE, f"correction/{n}/episode/{i}", {
            "round": n, "index": i, "who": "person", "candidate_id": candidate.id,
            "episode": {k: r[k] for k in _EPISODE_KEYS}, "dataset": digest})
        return i

    def record_pending(self, *, retrain: bool = True) -> int | None:
        """Record the next round from its ``correction_episode`` events (a session killed while the person
        played); None when there are none.

        Raises:
            LedgerError: an episode's data set is missing from the store.
        """
        from ratchet.data import Dataset

        eps = self.pending_episodes()
        if not eps:
            return None
        cand = self.state.candidate(eps[0]["candidate_id"])
        data = Dataset.from_bytes(self.artifact(eps[0]["dataset"]))
        for e in eps[1:]:
            data = data.concat(Dataset.from_bytes(self.artifact(e["dataset"])))
        return self.record(cand, [e["episode"] for e in eps], data, retrain=retrain)

    def candidate(self, candidate_id: str | None = None) -> Candidate:
        """The candidate the person corrects: ``candidate_id`` (a unique prefix is enough) or the incumbent.

        Raises:
            RunNotFoundError: no unique candidate with that id.
            RatchetError: it is not an ``mlp`` policy.
        """
        from ratchet.errors import RunNotFoundError

        cid = candidate_id or self.state.incumbent_id or ""
        try:
            cand = self.state.candidate(cid)
        except KeyError:
            raise RunNotFoundError(f"no unique candidate {cid!r} in run {self.state.run_id}; `ratchet show "
                                   f"{self.state.run_id} --json` gives the incumbent's id") from None
        if cand.kind != "mlp" or "weights" not in cand.artifacts:
            raise RatchetError(f"candidate {cand.id} is a {cand.kind} policy; a correction round retrains mlp students "
                               "(runs with [policy] kind = \"mlp\")")
        return cand

    def artifact(self, digest: str) -> bytes:
        """An artifact's bytes from the run's store.

        Raises:
            LedgerError: missing or damaged.
        """
        return self.ledger.get_artifact(digest)

    def seeds(self, episodes: int) -> list[int]:
        """``episodes`` fresh training-split seeds for the next round's episodes (never validation or test
        seeds; never seeds an earlier round played)."""
        from ratchet.planner import SeedSplits

        played = sum(len(r["recorded"]["seeds"]) for r in correction_rounds(self.ledger.read()).values())
        return SeedSplits(int(self.state.spec.get("seed", 0))).seeds("train", PERSON_SEEDS_START + played, episodes)

    # -- 1. record -------------------------------------------------------------------------------
    def record(self, candidate: Candidate, records: Sequence[Mapping[str, Any]], dataset: Any, *,
               retrain: bool = True) -> int:
        """Append the person's round to the ledger: the data set as an artifact, then ``correction_recorded``.

        Args:
            candidate: The candidate played (see :meth:`candidate`).
            records: One per finished episode, as :attr:`ratchet.correct.CorrectionSession.records` gives them:
                ``seed``, ``length`` (env steps), ``return``, ``terminated``, ``truncated``, ``segments``
                (``[[start, end, "student"|"person"], …]``, end exclusive, covering the episode) and
                ``person_steps``.
            dataset: The person's steps of those episodes (:class:`ratchet.data.Dataset`, ``expert`` True).
            retrain: False: the round is recorded only (:meth:`finish` retrains and gates it later).

        Returns:
            The round's number.

        Raises:
            RatchetError: no episode, or records that do not match the data set.
        """
        records = _checked(records)
        if not records:
            raise RatchetError("no episode was played to the end; nothing to record")
        person = sum(int(r["person_steps"]) for r in records)
        if person != len(dataset):
            raise RatchetError(f"the data set holds {len(dataset)} steps, the episodes {person} person steps")
        n = self.next_round
        digest = self.ledger.put_artifact(dataset.to_bytes())  # before the event that names it
        self.ledger.append(EventType.CORRECTION_RECORDED, f"correction/{n}/recorded", {
            "round": n, "who": "person", "candidate_id": candidate.id, "seeds": [int(r["seed"]) for r in records],
            "episodes": [{k: r[k] for k in _EPISODE_KEYS} for r in records], "person_steps": person,
            "env_steps": sum(int(r["length"]) for r in records), "dataset": digest, "dataset_summary": dataset.summary(),
            "retrain": bool(retrain)})
        self.refresh()
        return n

    # -- 2. retrain and gate ---------------------------------------------------------------------
    def finish(self, round_no: int | None = None, *, updates: int | None = None) -> dict[str, Any]:
        """Retrain on the round's data, gate the student and evaluate the incumbent on test (see the module
        doc); what was already recorded is read back, nothing is done twice.

        Args:
            round_no: The round (default the newest unfinished one).
            updates: Gradient steps of behaviour cloning; default the run's correction refiner's ``updates``
                (its first ``dagger``/``hg-dagger``/``bc`` table), else 2000. Recorded in the job's settings.

        Returns:
            The ``correction_finished`` payload: ``round``, ``student_id`` (None when nothing was retrained),
            ``gated``, ``promoted``, ``reason``, ``incumbent_id`` (after the round), ``test`` (summary),
            ``env_steps`` (``person``, ``validation``, ``test``) and more.

        Raises:
            RatchetError: no such round, or no unfinished one.
        """
        events = self.ledger.read()
        rounds = correction_rounds(events)
        n = unfinished_round(events) if round_no is None else round_no
        if n is None or n not in rounds:
            raise RatchetError(f"run {self.state.run_id} has no " + ("unfinished correction round" if round_no is None
                                                                     else f"correction round {round_no}"))
        if rounds[n]["finished"] is not None:
            return dict(rounds[n]["finished"])
        if n != max(rounds):
            raise RatchetError(f"correction round {n} of run {self.state.run_id} is not the newest; only the newest "
                               "round can be retrained and gated")
        rec = rounds[n]["recorded"]
        earlier = [e for e in events if e.payload.get("correction_round") != n]  # the run as the round found it
        st = project(earlier)
        assert st.incumbent_id is not None and st.baseline_id is not None  # a run with a round has both
        played = st.candidate(rec["candidate_id"])
        incumbent = st.candidate(st.incumbent_id)
        baseline = st.candidate(st.baseline_id)
        run = self._wired_run(earlier)
        run.event_tag = {"correction_round": n}
        generation = st.generations
        out: dict[str, Any] = {"round": n, "parent_id": played.id, "previous_incumbent_id": incumbent.id,
                               "student_id": None, "gated": False, "promoted": False}
        new_incumbent = incumbent
        if rec["person_steps"] == 0:
            out["reason"] = "the person never took over: no new steps to learn from, nothing retrained"
        else:
            student, training = self._retrain(run, played, rec, n, updates)
            out.update(training)
            if student is None:
                out["reason"] = f"retraining failed: {training['error']}"
            else:
                out["student_id"] = student.id
                run.record_candidate(student, generation)
                inc_val = Evaluation(incumbent.id, "validation", ())  # extended by the gate, read back where recorded
                decision, cand_val, _ = run.decide(generation, student, incumbent, inc_val, label=f"correction-{n}")
                out["gated"] = decision is not None
                if decision is None:
                    out["reason"] = "validation cut short"
                else:
                    out.update(promoted=decision.promoted, reason=decision.reason, p_value=decision.p_value,
                               mean_diff=decision.mean_diff, candidate_validation=cand_val.summary())
                    if decision.promoted:
                        new_incumbent = student
        # the incumbent's test evaluation (read back when it did not change), for the report only
        test = run.evaluate([new_incumbent, baseline], run.test_seeds, "test", generation)
        out["incumbent_id"] = new_incumbent.id
        out["test"] = test[new_incumbent.id].summary()
        out["test_critique"] = run.critic.critique(test[new_incumbent.id], test[baseline.id]).to_dict()
        mine = [e for e in self.ledger.read()
                if e.type is EventType.EPISODES_EVALUATED and e.payload.get("correction_round") == n]
        out["env_steps"] = {"person": int(rec["env_steps"]),
                            **{s: sum(e.payload["summary"]["env_steps"] for e in mine if e.payload["split"] == s)
                               for s in ("validation", "test")}}
        run.record(EventType.CORRECTION_FINISHED, f"correction/{n}/finished", out)
        self.refresh()
        finished = self.ledger.get(f"correction/{n}/finished")
        assert finished is not None  # recorded just above
        return dict(finished.payload)

    def _wired_run(self, events: Sequence[Any]) -> Any:
        """The run's loop wiring (:func:`ratchet.loop.rebuild_run`), taken up where ``events`` leave it."""
        if self._run is None:
            from ratchet.loop import rebuild_run

            self._run, self._lock_fd = rebuild_run(self.ledger, self.run_dir, self._lock_fd, self._executor,
                                                   storage=self._storage)
            self._executor = self._run.executor
            self._run.caps_steps = False  # outside the run's budget: no env-step cap on the round's episodes
        self._run.restore(events)
        return self._run

    def _retrain(self, run: Any, played: Candidate, rec: Mapping[str, Any], n: int,
                 updates: int | None) -> tuple[Candidate | None, dict[str, Any]]:
        """The round's training job (read back when recorded) and the student it gives."""
        from ratchet.execution.training import TrainingJob
        from ratchet.refiners.dagger import ANSWER, MODES, CorrectionSettings

        table: dict[str, Any] = next((e for e in run.spec.refiner_entries() if e["kind"] in MODES), {})
        fields = CorrectionSettings.model_fields
        settings = {k: table.get(k, fields[k].default) for k in ("updates", "batch_size", "learning_rate")}
        if updates is not None:
            settings["updates"] = int(updates)
        settings.update(mode="person", round=n, seed=int(run.spec.seed) + n, env_id=run.task.env_id)
        arts = {"weights": played.artifacts["weights"], "corrections": rec["dataset"]}
        if "dataset" in played.artifacts:
            arts["dataset"] = played.artifacts["dataset"]
        parent = Candidate.create("", {}, kind="mlp", artifacts=arts, parent_id=played.id, refiner="person")
        job = TrainingJob("dagger", parent, settings, (), 0, answer=ANSWER)
        result = run.train(job)
        info = {"training": f"training/{job.key}", "error": result.error}
        if result.error or not result.outputs:
            info["error"] = result.error or "the trainer gave no student"
            return None, info
        o = result.outputs[0]
        digests = o.info["artifacts"]
        info.update(dataset=o.info.get("dataset"), bc=o.info.get("bc"))
        student = Candidate.create("", {}, kind="mlp", parent_id=played.id, refiner="person",
                                   artifacts={"weights": digests["weights"], "dataset": digests["dataset"]})
        return student, info

    # -- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the lease and lock, close the ledger (and the executor, when this round started it)."""
        import os

        if self._run is not None and self._own_executor:
            self._run.executor.close()
            self._run = None
        lease = getattr(self, "_lease", None)
        if lease is not None:
            lease.release()
            self._lease = None
        if getattr(self, "ledger", None) is not None:
            self.ledger.close()
            self.ledger = None  # type: ignore[assignment]
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
