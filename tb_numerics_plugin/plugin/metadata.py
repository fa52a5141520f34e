"""Names and limits of the ``numerics`` TensorBoard plugin.

TensorBoard mounts the routes under ``/data/plugin/<PLUGIN_NAME>/``; the
frontend and ``docs/http_api.md`` rely on every value here.
"""

PLUGIN_NAME = "numerics"
TAB_NAME = "Numerics Debugger"
# Path of the frontend's entry module, relative to the plugin's route prefix.
ES_MODULE_PATH = "/static/index.js"

# Server-side page caps (items per answer), as documented in docs/http_api.md.
DIGEST_PAGE_CAP = 1000
DATA_PAGE_CAP = 100
# Most stack frame ids one request may ask for.
STACK_FRAME_IDS_CAP = 1000

DIRECTIONS = {"next": 1, "prev": -1}
