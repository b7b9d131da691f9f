"""The loop rule's audit of samples decoded without it (semjobs.jobs.loop_audit), on a
tokenizer that reads one character as one token."""

from semjobs.jobs.loop_audit import audit
from semspec.repetition import LoopRule


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def __len__(self):
        return 128

    def batch_decode(self, ids):
        return ["".join(chr(i) for i in x) for x in ids]


RULE = LoopRule(repeats=3, min_unit=4, max_unit=32)


def test_false_cuts_are_eos_samples_with_a_loop_and_tails_run_from_onset_to_cap():
    loop = "The answer is 7.\n" * 6  # 17 characters a copy: the rule fires at its third
    samples = [
        ("So 3 + 4 = 7.\nThe answer is 7.", "eos"),  # clean
        ("x " + "abcd" * 5, "eos"),  # a loop in an ended sample: a false cut
        ("Step one.\n" + loop, "length"),  # a loop to the cap
        ("ramble on and on without repeating", "length"),  # capped, no loop
        ("", "repetition"),  # decoded with the rule on: not audited
    ]
    got = audit(samples, CharTokenizer(), RULE)
    assert (got["eos_samples"], got["eos_cut"], got["false_cut_share"]) == (2, 1, 0.5)
    assert (got["capped_samples"], got["capped_looping"]) == (2, 1)
    # 112 characters: the loop's first copy (from 10 to 27, the copy that starts a line) stays;
    # the rule fires once three copies of a rotation of it, ".\nThe answer is 7" from the ".\n"
    # of "one.\n" at 8, are in (59)
    assert (got["tail_tokens"], got["tail_tokens_spared"]) == (112 - 27, 112 - 59)
