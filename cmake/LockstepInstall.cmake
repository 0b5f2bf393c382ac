# Install rules and the find_package(Lockstep) package (filled in by the ecosystem work).
