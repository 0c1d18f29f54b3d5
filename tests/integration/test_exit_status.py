"""TODO"""

def test_placeholder():
    pass
