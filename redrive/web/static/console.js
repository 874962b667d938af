// The console's own few lines: pages work without them (forms, links, a refresh link).
"use strict";
