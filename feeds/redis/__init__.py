"""The Redis Cluster engine (issue 24): any gateway node serves any pipe.

How it works: :mod:`.service` and docs/CLUSTER.md. Where things are:
:class:`RedisEngine` (:mod:`.service`) holds the engine's state and its lifecycle;
each method of the engine service hands over to a module of functions taking the
engine. From the top:

* what the service's methods do: :mod:`.lookups` (domains, feeds, pipes and joins
  as values), :mod:`.resources` (changes to the catalogue), :mod:`.publishing`
  (publishes, dead letters, room), :mod:`.streams` (a pipe's messages read, listed,
  leased, acknowledged), :mod:`.reading` (resolving keys, evented waits, contents),
  :mod:`.cursor`, :mod:`.admin`, :mod:`.settings`, :mod:`.webhooks` and
  :mod:`.owners`; :mod:`.upkeep` (sweeps) and :mod:`.announcing` (system events);
* beneath them: :mod:`.placing` (a publish's copies placed, taken back) and
  :mod:`.queueing` (rotator and service feeds), :mod:`.claims` (message ids),
  :mod:`.settling` (failed publishes), :mod:`.mirror` (traffic events),
  :mod:`.syncing` (the cached catalogue kept in step, records looked up) and
  :mod:`.waiting` (waiters and wake-ups);
* at the bottom: :mod:`.catalogue` (records, keys, the cache), :mod:`.values`,
  :mod:`.link` and :mod:`.wire` (the connections), and ``library.lua``.
"""

from .service import RedisEngine

__all__ = ["RedisEngine"]
