package actionscache

import (
	"errors"
	"time"
)

// Settings are the cache service's configuration (GDR_CACHE_*), read by the
// gateway and local mode.
type Settings struct {
	CacheDir            string        `envconfig:"GDR_CACHE_DIR" desc:"gateway and local: directory of the actions/cache service (a PersistentVolume in a cluster, shared by the gateway's replicas); gateway: empty serves no cache; local: empty is <state dir>/cache"`
	CacheMaxBytes       int64         `envconfig:"GDR_CACHE_MAX_BYTES" default:"10737418240" desc:"gateway and local: most bytes per repository of cache entries and uploads under way (each counted at its announced size); the least recently used entries are evicted, an upload past it refused"`
	CacheMaxEntries     int           `envconfig:"GDR_CACHE_MAX_ENTRIES" default:"1000" desc:"gateway and local: most cache entries per repository; the least recently used are evicted"`
	CacheMaxAge         time.Duration `envconfig:"GDR_CACHE_MAX_AGE" default:"168h" desc:"gateway and local: a cache entry neither saved nor restored for this long is removed"`
	CacheMaxTotalBytes  int64         `envconfig:"GDR_CACHE_MAX_TOTAL_BYTES" default:"42949672960" desc:"gateway and local: most bytes of the whole cache, across repositories, counted as GDR_CACHE_MAX_BYTES is; the least recently used entries of any repository are evicted; keep it below the volume's size (the default 40 GiB fits the 50 GiB claim of deploy/components/cache)"`
	CacheReservationTTL time.Duration `envconfig:"GDR_CACHE_RESERVATION_TTL" default:"1h" desc:"gateway and local: an upload not committed this long after its reservation is abandoned: removed at the next reservation of any repository"`
}

// Check checks the limits.
func (c Settings) Check() error {
	if c.CacheMaxBytes <= 0 || c.CacheMaxEntries <= 0 || c.CacheMaxAge <= 0 || c.CacheMaxTotalBytes <= 0 || c.CacheReservationTTL <= 0 {
		return errors.New("GDR_CACHE_MAX_BYTES, GDR_CACHE_MAX_ENTRIES, GDR_CACHE_MAX_AGE, GDR_CACHE_MAX_TOTAL_BYTES and GDR_CACHE_RESERVATION_TTL must be positive")
	}
	return nil
}

// Open returns the cache kept in dir with the configured limits.
func (c Settings) Open(dir string) *Cache {
	return &Cache{Storage: &Dir{Path: dir}, Limits: Limits{MaxBytes: c.CacheMaxBytes, MaxEntries: c.CacheMaxEntries, MaxAge: c.CacheMaxAge,
		MaxTotalBytes: c.CacheMaxTotalBytes, ReservationTTL: c.CacheReservationTTL}}
}
