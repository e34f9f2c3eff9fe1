pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.tenancy",
    "tests.fixtures.ors",
    "tests.fixtures.server",
]
