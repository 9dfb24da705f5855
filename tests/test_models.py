"""The job model's pure helpers."""

from __future__ import annotations

import msgspec

from sqlq.common.models import Job
from tests.helpers import NOW


def test_a_decoded_job_shares_its_names_and_equal_times_and_is_unchanged() -> None:
    """Many queued jobs hold the same kind, queue and times: ``compact`` shares them
    (memory per queued job) and changes nothing a reader can see."""
    original = Job.new(kind="sleep", args={"n": 1}, now=NOW, queue="mail")
    data = msgspec.json.encode(original)
    a = msgspec.json.decode(data, type=Job)
    b = msgspec.json.decode(data, type=Job)
    assert a.kind is not b.kind  # the decoder makes a new string per job
    a, b = a.compact(), b.compact()
    assert a == b == original
    assert a.kind is b.kind
    assert a.queue is b.queue
    assert a.updated_at is a.created_at
    assert a.ready_at is a.created_at
    delayed = Job.new(kind="sleep", args={}, now=NOW, ready_at=NOW + 5)
    again = msgspec.json.decode(msgspec.json.encode(delayed), type=Job).compact()
    assert again == delayed
    assert again.ready_at == NOW + 5


def test_the_id_shape_lives_beside_the_id_maker() -> None:
    """One home for what a job id looks like: 32 lowercase hex digits, as ``new_job_id``
    makes them; the API, the listing cursor and the dashboard all ask ``is_job_id``."""
    from sqlq.common import query
    from sqlq.common.models import JOB_ID_LENGTH, is_job_id, new_job_id

    made = new_job_id(NOW)
    assert len(made) == JOB_ID_LENGTH == 32
    assert is_job_id(made)
    for bad in ("", made[:-1], made + "0", made.upper(), "g" * 32, made + "\n", "0" * 64):
        assert not is_job_id(bad), bad
    assert query.is_job_id is is_job_id
