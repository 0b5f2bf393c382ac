// Registry: building components by `type`, and every way that can go wrong.
#include "lockstep/config/registry.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "lockstep/config/config_test_util.h"

namespace lockstep {
namespace {

using config_test::error_of;

struct Widget {
  virtual ~Widget() = default;
  std::string name;
  int size = 0;
};

Registry<Widget>& widget_registry() {
  static Registry<Widget> registry("widget");
  return registry;
}

// Registered the way users register: at namespace scope, before main().
LOCKSTEP_REGISTER(widget_registry(), "Knob", [](const Config& cfg) {
  auto widget = std::make_shared<Widget>();
  widget->name = "Knob";
  widget->size = cfg.get<int>("size", 1);
  return widget;
});
LOCKSTEP_REGISTER(widget_registry(), "Dial", [](const Config& cfg) {
  auto widget = std::make_shared<Widget>();
  widget->name = "Dial";
  widget->size = cfg.get<int>("size");
  return widget;
});
LOCKSTEP_REGISTER(widget_registry(), "Broken", [](const Config& cfg) -> std::shared_ptr<Widget> {
  throw std::runtime_error("the widget factory broke");
});
LOCKSTEP_REGISTER(widget_registry(), "Checked", [](const Config& cfg) -> std::shared_ptr<Widget> {
  LOCKSTEP_FAIL(cfg.where("size"), ": size must be even");
});
LOCKSTEP_REGISTER(widget_registry(), "Empty", [](const Config& cfg) { return std::shared_ptr<Widget>(); });

// A config with the widget under `widget:` (line 1), its keys from line 2 on.
Config widget_config(const std::string& body) {
  return parse_config("widget:\n" + body, "w.yaml").at("widget");
}

// The error building the widget `body` configures.
std::string build_error(const std::string& body) {
  return error_of([&] { widget_registry().build(widget_config(body)); });
}

TEST(RegistryTest, BuildsByTypeAndPassesTheConfig) {
  auto widget = widget_registry().build(widget_config("  type: Dial\n  size: 7\n"));
  ASSERT_NE(widget, nullptr);
  EXPECT_EQ(widget->name, "Dial");
  EXPECT_EQ(widget->size, 7);
  EXPECT_EQ(widget_registry().build_as("Knob", Config::map())->size, 1);
  EXPECT_TRUE(widget_registry().contains("Knob"));
  EXPECT_FALSE(widget_registry().contains("knob"));
  EXPECT_EQ(widget_registry().names(), (std::vector<std::string>{"Broken", "Checked", "Dial", "Empty", "Knob"}));
  EXPECT_EQ(widget_registry().kind(), "widget");
}

TEST(RegistryTest, UnknownTypeListsRegisteredNamesAndTheLocation) {
  EXPECT_EQ(build_error("  size: 1\n  type: Gizmo\n"),
            "w.yaml:3 (key widget.type): unknown widget type 'Gizmo'; registered widget types: "
            "Broken, Checked, Dial, Empty, Knob");
  Registry<Widget> empty("gadget");
  EXPECT_EQ(error_of([&] { empty.build(widget_config("  type: X\n")); }),
            "w.yaml:2 (key widget.type): unknown gadget type 'X'; registered gadget types: (none)");
}

TEST(RegistryTest, ConfigMustBeAMapWithAType) {
  EXPECT_EQ(error_of([] { widget_registry().build(parse_config("widget: Knob\n", "w.yaml").at("widget")); }),
            "w.yaml:1 (key widget): a widget is configured as a map with a 'type' key");
  EXPECT_EQ(build_error("  size: 1\n"), "w.yaml:1 (key widget): missing key 'type'");
  EXPECT_EQ(build_error("  type: [Knob]\n"), "w.yaml:2 (key widget.type): expected a string, got a sequence");
}

// A component with nothing to configure may be named alone (`comm_hook:
// fp16_compress`, `auto_wrap_policy: transformer`); a map still works.
TEST(RegistryTest, BuildsFromABareNameOrAMap) {
  auto build_named = [](const std::string& name) {
    return widget_registry().build_from_name_or_map(parse_config("widget: " + name + "\n", "w.yaml").at("widget"));
  };
  EXPECT_EQ(build_named("Knob")->name, "Knob");
  EXPECT_EQ(build_named("Knob")->size, 1);
  EXPECT_EQ(widget_registry().build_from_name_or_map(widget_config("  type: Dial\n  size: 7\n"))->size, 7);
  EXPECT_EQ(error_of([&] { build_named("Gizmo"); }),
            "w.yaml:1 (key widget): unknown widget type 'Gizmo'; registered widget types: "
            "Broken, Checked, Dial, Empty, Knob");
  // A bare name gives no options: a factory that needs one says which.
  EXPECT_NE(error_of([&] { build_named("Dial"); }).find("'size'"), std::string::npos);
}

TEST(RegistryTest, FactoryErrorsCarryTheLocation) {
  EXPECT_EQ(build_error("  type: Broken\n"),
            "w.yaml:1 (key widget): building widget 'Broken': the widget factory broke");
  // A lockstep::Error already says where; it passes through unchanged.
  EXPECT_EQ(build_error("  type: Checked\n  size: 3\n"), "w.yaml:3 (key widget.size): size must be even");
  EXPECT_EQ(build_error("  type: Dial\n  size: big\n"), "w.yaml:3 (key widget.size): expected an integer, got 'big'");
  EXPECT_EQ(build_error("  type: Empty\n"), "w.yaml:1 (key widget): the factory of widget 'Empty' returned nothing");
}

TEST(RegistryTest, KeysTheFactoryNeverReadAreRejectedAfterBuild) {
  EXPECT_EQ(build_error("  type: Knob\n  sise: 3\n"),
            "w.yaml:3 (key widget.sise): unknown key for widget 'Knob' (did you mean 'size'?); it reads: size, type");
  EXPECT_EQ(error_of([] {
              widget_registry().build(widget_config("  type: Knob\n  a: 1\n  size: 2\n  b: {c: 1}\n"));
            }),
            "2 unknown keys for widget 'Knob':\n"
            "  w.yaml:3 (key widget.a): unknown key for widget 'Knob'; it reads: size, type\n"
            "  w.yaml:5 (key widget.b): unknown key for widget 'Knob'; it reads: size, type");
}

TEST(RegistryTest, DuplicateAndEmptyNamesAreRefused) {
  auto factory = [](const Config&) { return std::make_shared<Widget>(); };
  EXPECT_EQ(error_of([&] { widget_registry().add("Knob", factory); }), "widget type 'Knob' is registered twice");
  EXPECT_EQ(error_of([&] { widget_registry().add("", factory); }), "cannot register a widget with an empty name");
}

TEST(RegistryTest, ExtraFactoryArgumentsAreForwarded) {
  Registry<Widget, int, const std::string&> registry("sized widget");
  registry.add("Scaled", [](const Config& cfg, int scale, const std::string& name) {
    auto widget = std::make_shared<Widget>();
    widget->size = cfg.get<int>("size") * scale;
    widget->name = name;
    return widget;
  });
  auto widget = registry.build(widget_config("  type: Scaled\n  size: 4\n"), 3, "w");
  EXPECT_EQ(widget->size, 12);
  EXPECT_EQ(widget->name, "w");
}

}  // namespace
}  // namespace lockstep
