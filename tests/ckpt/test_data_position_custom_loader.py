"""C1's data position when the training dict's loader is not a torch DataLoader (a loop's own iterable class or
a generator, as a token-streaming pretraining loop keeps in state['dataloader']): the pass names what the dict holds
(not "no dataloader") and counts as partly judged; a dict with no loader at all says that, also partly judged."""

from test_data_position import LOOP

#: the loop's own loader: an iterable class whose iterator is a generator of (x, y) batches
OWN_LOADER = """
    class StreamLoader:
        def __init__(self, start=0):
            self.start = start

        def __iter__(self):
            for i in range(self.start, 4):
                yield DATA[2 * i : 2 * i + 2]
"""


def test_a_loader_of_the_loops_own_kind_is_named_and_the_pass_is_partly_judged(project):
    source = (LOOP.format(skip='state["dataloader"] = StreamLoader(ckpt["step"])') + OWN_LOADER).replace(
        '"dataloader": loader,', '"dataloader": StreamLoader(),'
    )
    project.conftest(source)
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(["*C1_resume PASSED (*; partly judged: data position not judged)*"])
    assert (
        "data position: not judged: state['dataloader'] is a StreamLoader, not a torch DataLoader (dlcheck draws the "
        "save-and-resume runs from a torch DataLoader only)" in run.text
    ), run.text
    assert "holds no dataloader" not in run.text, run.text


def test_a_dict_without_a_loader_is_partly_judged_too(project):
    project.conftest(LOOP.format(skip="").replace('"dataloader": loader,', ""))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "*C1_resume PASSED (*; partly judged: data position not judged)*",
            "data position: not judged: the dlcheck_make_training dict holds no dataloader*",
        ]
    )
