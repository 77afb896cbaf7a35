package billing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// RateScale is how many rate units make one minor unit: hourly rates are
// kept in 1/10000 of a minor unit so that, say, 0.5 kopeck per GB and hour
// is the integer 5000.
const RateScale = 10000

// MaxRate bounds one hourly rate (rate units), so that no product of rate
// and quantity can overflow int64.
const MaxRate = 10_000_000_000

// PriceList is the operator's hourly rates, in rate units (1/RateScale of a
// minor unit) per hour.
type PriceList struct {
	VCPU          int64            `json:"vcpu"`
	RAMGB         int64            `json:"ram_gb"`
	DiskGB        map[string]int64 `json:"disk_gb"` // by disk type: local, network
	GPU           map[string]int64 `json:"gpu"`     // by GPU model (nimbus:gpu_model)
	PublicIPv4    int64            `json:"public_ipv4"`
	WindowsVCPU   int64            `json:"windows_vcpu"`   // Windows licence per vCPU
	WindowsServer int64            `json:"windows_server"` // Windows licence per server
	VolumeGB      int64            `json:"volume_gb"`
	SnapshotGB    int64            `json:"snapshot_gb"` // volume snapshots
	BackupGB      int64            `json:"backup_gb"`
	ImageGB       int64            `json:"image_gb"` // stored image data other than backups
	// TermDiscounts are the prepaid terms on sale: months → discount in
	// basis points (500 = 5%). Not a rate: kept here because the operator
	// edits it with the rates.
	TermDiscounts map[string]int64 `json:"term_discounts"`
}

// rates are the list's single rates by billing_prices key, and maps its
// keyed rates by key prefix: the one place a rate is named.
func (p *PriceList) rates() (map[string]*int64, map[string]map[string]int64) {
	return map[string]*int64{"vcpu": &p.VCPU, "ram_gb": &p.RAMGB, "public_ipv4": &p.PublicIPv4,
			"windows_vcpu": &p.WindowsVCPU, "windows_server": &p.WindowsServer, "volume_gb": &p.VolumeGB,
			"snapshot_gb": &p.SnapshotGB, "backup_gb": &p.BackupGB, "image_gb": &p.ImageGB},
		map[string]map[string]int64{"disk_gb:": p.DiskGB, "gpu:": p.GPU, "term:": p.TermDiscounts}
}

// rows flattens the list into billing_prices rows.
func (p *PriceList) rows() map[string]int64 {
	single, keyed := p.rates()
	m := map[string]int64{}
	for k, v := range single {
		m[k] = *v
	}
	for prefix, rates := range keyed {
		for k, v := range rates {
			m[prefix+k] = v
		}
	}
	return m
}

// set sets the rate of a billing_prices key; an unknown key is ignored.
func (p *PriceList) set(key string, v int64) {
	single, keyed := p.rates()
	if r, ok := single[key]; ok {
		*r = v
		return
	}
	for prefix, rates := range keyed {
		if k, ok := strings.CutPrefix(key, prefix); ok {
			rates[k] = v
			return
		}
	}
}

// validate checks every rate is in [0, MaxRate].
func (p *PriceList) validate() error {
	rows := p.rows()
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if m, ok := strings.CutPrefix(k, "term:"); ok {
			if n, err := strconv.Atoi(m); err != nil || n < 1 || n > maxTermMonths || strconv.Itoa(n) != m {
				return fmt.Errorf("term %q must be a whole number of months from 1 to %d", m, maxTermMonths)
			}
			if v := rows[k]; v < 0 || v >= 10000 {
				return fmt.Errorf("discount of term %s must be between 0 and 9999 basis points, got %d", m, v)
			}
			continue
		}
		if v := rows[k]; v < 0 || v > MaxRate {
			return fmt.Errorf("rate %s must be between 0 and %d, got %d", k, int64(MaxRate), v)
		}
		if strings.HasSuffix(k, ":") {
			return fmt.Errorf("rate %s needs a name", k)
		}
	}
	return nil
}

// loadPrices reads the price list.
func loadPrices(ctx context.Context, q store.Querier) (*PriceList, error) {
	rows, err := q.Query(ctx, "SELECT rate_key, rate FROM billing_prices")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	p := &PriceList{DiskGB: map[string]int64{}, GPU: map[string]int64{}, TermDiscounts: map[string]int64{}}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		p.set(k, v)
	}
	return p, rows.Err()
}

// savePrices replaces the stored price list with p.
func savePrices(ctx context.Context, tx *store.Tx, p *PriceList) error {
	if _, err := tx.Exec(ctx, "DELETE FROM billing_prices"); err != nil {
		return err
	}
	for k, v := range p.rows() {
		if _, err := tx.Exec(ctx, "INSERT INTO billing_prices (rate_key, rate) VALUES (?, ?)", k, v); err != nil {
			return err
		}
	}
	return nil
}

// Choice is one configurator choice: what a server (or several equal
// servers) is made of.
type Choice struct {
	VCPUs      int64  `json:"vcpus"`
	RAMMB      int64  `json:"ram_mb"`
	DiskType   string `json:"disk_type"` // local (default) or network
	DiskGB     int64  `json:"disk_gb"`
	GPUModel   string `json:"gpu_model,omitempty"`
	GPUCount   int64  `json:"gpu_count,omitempty"`
	PublicIPv4 bool   `json:"public_ipv4"`
	OSType     string `json:"os_type,omitempty"` // "windows" adds the licence
	VolumeGB   int64  `json:"volume_gb,omitempty"`
	SnapshotGB int64  `json:"snapshot_gb,omitempty"`
	BackupGB   int64  `json:"backup_gb,omitempty"`
	ImageGB    int64  `json:"image_gb,omitempty"`
	Quantity   int64  `json:"quantity"` // 0 means 1
}

// LineItem is one priced part of a quote, for one server and one hour.
type LineItem struct {
	Item     string `json:"item"`
	Quantity int64  `json:"quantity"`
	Unit     string `json:"unit"`
	Rate     int64  `json:"rate"`   // rate units per unit and hour
	Hourly   int64  `json:"hourly"` // minor units, rounded up
}

// Quote is the price of a choice.
type Quote struct {
	Currency      string     `json:"currency"`
	Items         []LineItem `json:"items"`
	HourlyEach    int64      `json:"hourly_each"` // one server, minor units per hour
	Quantity      int64      `json:"quantity"`
	Hourly        int64      `json:"hourly"`  // all servers, minor units per hour
	Monthly       int64      `json:"monthly"` // Hourly × HoursPerMonth
	HoursPerMonth int        `json:"hours_per_month"`
	// The tariff: "hourly" (pay as you go, for DurationHours: one month of
	// HoursPerMonth when not given) or "prepaid" (TermMonths paid up front
	// at DiscountBP off). Total is the whole term's or duration's price for
	// all servers.
	Tariff        string `json:"tariff"`
	TermMonths    int    `json:"term_months,omitempty"`
	DiscountBP    int64  `json:"discount_bp,omitempty"`
	DurationHours int64  `json:"duration_hours,omitempty"`
	Total         int64  `json:"total"`
}

// Tariffs.
const (
	TariffHourly  = "hourly"
	TariffPrepaid = "prepaid"
)

// maxDurationHours bounds a rental duration (ten years).
const maxDurationHours = 10 * 366 * 24

// WithTariff prices q's choice for a tariff: a prepaid term of months, as
// BuyTerm charges it per server, or pay-as-you-go for hours (0: one month
// of q.HoursPerMonth, so that an hourly total is never an empty 0).
func (p *PriceList) WithTariff(q Quote, tariff string, months int, hours int64) (Quote, error) {
	switch tariff {
	case "", TariffHourly:
		if months != 0 {
			return q, fmt.Errorf("%w: term_months needs the prepaid tariff", ErrInvalid)
		}
		if hours < 0 || hours > maxDurationHours {
			return q, fmt.Errorf("%w: duration_hours must be between 0 and %d", ErrInvalid, maxDurationHours)
		}
		if hours == 0 {
			hours = int64(q.HoursPerMonth)
		}
		total, err := mulMoney(q.Hourly, hours)
		if err != nil {
			return q, fmt.Errorf("%w: price too large", ErrInvalid)
		}
		q.Tariff, q.DurationHours, q.Total = TariffHourly, hours, total
	case TariffPrepaid:
		if hours != 0 {
			return q, fmt.Errorf("%w: a prepaid term is set by term_months, not duration_hours", ErrInvalid)
		}
		each, err := p.TermPrice(q.HourlyEach, months, q.HoursPerMonth)
		if err != nil {
			return q, err
		}
		q.Tariff, q.TermMonths, q.DiscountBP = TariffPrepaid, months, p.TermDiscounts[strconv.Itoa(months)]
		if q.Total, err = mulMoney(each, q.Quantity); err != nil {
			return q, fmt.Errorf("%w: price too large", ErrInvalid)
		}
	default:
		return q, fmt.Errorf("%w: tariff must be %q or %q", ErrInvalid, TariffHourly, TariffPrepaid)
	}
	return q, nil
}

// ErrUnpriced is wrapped by quote errors for a choice the price list has no
// rate for (an unknown disk type or GPU model).
var ErrUnpriced = errors.New("no price")

// ErrInvalid is wrapped by quote errors for a choice out of range.
var ErrInvalid = errors.New("invalid choice")

// Limits on a choice, far above any real server, that keep every product
// inside int64 together with MaxRate.
const (
	maxUnits    = 1 << 20 // vCPUs, GB, GPUs
	maxRAMMB    = 1 << 28
	maxQuantity = 10000
)

// Quote prices a choice per hour and per month. It is the one function both
// the quote API and the charging pass use, so a quote always equals what is
// charged. Line items are rounded up to whole minor units each; the hourly
// price is their sum.
func (p *PriceList) Quote(c Choice, currency string, hoursPerMonth int) (Quote, error) {
	q := Quote{Currency: currency, HoursPerMonth: hoursPerMonth, Quantity: c.Quantity}
	if q.Quantity == 0 {
		q.Quantity = 1
	}
	switch {
	case c.VCPUs < 0 || c.VCPUs > maxUnits, c.DiskGB < 0 || c.DiskGB > maxUnits,
		c.GPUCount < 0 || c.GPUCount > maxUnits, c.RAMMB < 0 || c.RAMMB > maxRAMMB,
		c.VolumeGB < 0 || c.VolumeGB > maxUnits, c.SnapshotGB < 0 || c.SnapshotGB > maxUnits, c.BackupGB < 0 || c.BackupGB > maxUnits,
		c.ImageGB < 0 || c.ImageGB > maxUnits:
		return q, fmt.Errorf("%w: vcpus, ram, disk_gb and gpu_count must be between 0 and %d", ErrInvalid, maxUnits)
	case q.Quantity < 0 || q.Quantity > maxQuantity:
		return q, fmt.Errorf("%w: quantity must be between 1 and %d", ErrInvalid, maxQuantity)
	case c.GPUCount > 0 && c.GPUModel == "":
		return q, fmt.Errorf("%w: gpu_count needs a gpu_model", ErrInvalid)
	}
	add := func(item, unit string, n, rate, div int64) {
		if n == 0 {
			return
		}
		// n ≤ 2^28 and rate ≤ 10^10 keep n*rate below 2^63.
		amount := ceilDiv(n*rate, RateScale*div)
		q.Items = append(q.Items, LineItem{Item: item, Quantity: n, Unit: unit, Rate: rate, Hourly: amount})
		q.HourlyEach += amount
	}
	add("vcpu", "vcpu", c.VCPUs, p.VCPU, 1)
	// RAM is priced per GB but charged by the MB, so 512 MB pays half a GB.
	add("ram", "MB", c.RAMMB, p.RAMGB, 1024)
	diskType := c.DiskType
	if diskType == "" {
		diskType = "local"
	}
	if c.DiskGB > 0 {
		rate, ok := p.DiskGB[diskType]
		if !ok {
			return q, fmt.Errorf("%w for disk type %q", ErrUnpriced, diskType)
		}
		add("disk:"+diskType, "GB", c.DiskGB, rate, 1)
	}
	if c.GPUCount > 0 {
		rate, ok := p.GPU[c.GPUModel]
		if !ok {
			return q, fmt.Errorf("%w for GPU model %q", ErrUnpriced, c.GPUModel)
		}
		add("gpu:"+c.GPUModel, "gpu", c.GPUCount, rate, 1)
	}
	if c.PublicIPv4 {
		add("public_ipv4", "address", 1, p.PublicIPv4, 1)
	}
	if strings.EqualFold(c.OSType, "windows") {
		add("os:windows", "vcpu", c.VCPUs, p.WindowsVCPU, 1)
		add("os:windows", "server", 1, p.WindowsServer, 1)
	}
	add("volume", "GB", c.VolumeGB, p.VolumeGB, 1)
	add("snapshot", "GB", c.SnapshotGB, p.SnapshotGB, 1)
	add("backup", "GB", c.BackupGB, p.BackupGB, 1)
	add("image", "GB", c.ImageGB, p.ImageGB, 1)
	// Each item is below 2^48 minor units; check the products anyway.
	if q.HourlyEach > math.MaxInt64/maxQuantity/int64(max(hoursPerMonth, 1)) {
		return q, fmt.Errorf("%w: price too large", ErrInvalid)
	}
	q.Hourly = q.HourlyEach * q.Quantity
	q.Monthly = q.Hourly * int64(hoursPerMonth)
	q.Tariff = TariffHourly
	if q.Items == nil {
		q.Items = []LineItem{}
	}
	return q, nil
}

// maxTermMonths is the longest prepaid term.
const maxTermMonths = 60

// ChoiceOf is the configurator choice a metered resource amounts to.
func ChoiceOf(kind string, sp metering.Spec) Choice {
	switch kind {
	case metering.KindPublicIP:
		return Choice{PublicIPv4: true, Quantity: 1}
	case metering.KindVolume:
		return Choice{VolumeGB: sp.SizeGB, Quantity: 1}
	case metering.KindSnapshot:
		return Choice{SnapshotGB: sp.SizeGB, Quantity: 1}
	case metering.KindBackup:
		return Choice{BackupGB: sp.SizeGB, Quantity: 1}
	case metering.KindImage:
		return Choice{ImageGB: sp.SizeGB, Quantity: 1}
	}
	// A server's SizeGB is never metered; the gate is asked about a create
	// with the volumes it makes beside the server.
	return Choice{VCPUs: sp.VCPUs, RAMMB: sp.RAMMB, DiskType: sp.DiskType, DiskGB: sp.DiskGB, GPUModel: sp.GPUModel,
		GPUCount: sp.GPUCount, PublicIPv4: sp.PublicIPv4, OSType: sp.OSType, VolumeGB: sp.SizeGB, Quantity: 1}
}

// HourlyOf is a metered resource's price for one hour. When the price list
// lacks a rate the resource needs (a GPU model or disk type no longer
// sold), it answers the price of what is priced, and the error.
func (p *PriceList) HourlyOf(kind string, sp metering.Spec, currency string, hoursPerMonth int) (int64, error) {
	c := ChoiceOf(kind, sp)
	q, err := p.Quote(c, currency, hoursPerMonth)
	if err == nil {
		return q.Hourly, nil
	}
	c.GPUCount, c.GPUModel = 0, ""
	if _, ok := p.DiskGB[c.DiskType]; !ok {
		c.DiskType = "local"
	}
	q2, err2 := p.Quote(c, currency, hoursPerMonth)
	if err2 != nil {
		return 0, err2
	}
	return q2.Hourly, err
}

// TermPrice is the up-front price of a prepaid term of months for a
// resource of hourly price: hourly × hours per month × months, less the
// term's discount, rounded up. ErrUnpriced when no such term is sold.
func (p *PriceList) TermPrice(hourly int64, months, hoursPerMonth int) (int64, error) {
	bp, ok := p.TermDiscounts[strconv.Itoa(months)]
	if !ok {
		return 0, fmt.Errorf("%w for a term of %d months: terms on sale are %s", ErrUnpriced, months, p.termList())
	}
	full, err := mulMoney(hourly, int64(hoursPerMonth)*int64(months))
	if err == nil {
		full, err = mulMoney(full, 10000-bp)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: price too large", ErrInvalid)
	}
	return ceilDiv(full, 10000), nil
}

// termList names the terms on sale, e.g. "1, 3, 6, 12 months".
func (p *PriceList) termList() string {
	var ms []int
	for k := range p.TermDiscounts {
		if n, err := strconv.Atoi(k); err == nil {
			ms = append(ms, n)
		}
	}
	sort.Ints(ms)
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = strconv.Itoa(m)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ") + " months"
}

// ceilDiv is a/b rounded up, for a ≥ 0 and b > 0, without overflow.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}
